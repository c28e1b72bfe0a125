"""The config boundary's one lookup mechanism: `Registry`, `load_object`.

Flat name -> object registries filled by a decorator; unknown names are errors that list the
valid ones; references 'package.module:attr' and 'path/to/file.py:attr' load user plug-ins.
Defined in `rewards.lookup` (the bottom of the dependency order, so rewards can use it
without importing the core) and re-exported here for the core and the adapters.
"""

from rewards.lookup import (
    LookupFailed,
    Registry,
    is_reference,
    load_object,
    unexpected_kwargs,
)

__all__ = ["LookupFailed", "Registry", "is_reference", "load_object", "unexpected_kwargs"]
