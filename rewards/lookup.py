"""Name or reference -> object: the one lookup mechanism of mmrl's config boundary.

A config names a component in one of three ways:

    a registered name        grpo, token-mean, vlm, format, ...
    'package.module:attr'    an importable module's attribute (`attr` may be dotted: Class.method)
    'path/to/file.py:attr'   a Python file, executed once per absolute path

`Registry` is a flat name -> object map filled by a decorator; a value may also be a lazy
'module:attr' (or plain 'module') string imported on first use, so the core can name adapters
without importing them. A failed look-up is a `LookupFailed` (a `ValueError` and a `KeyError`)
whose message names the config key and lists the valid names.

This module lives in `rewards`, the package at the bottom of the dependency order (it imports
nothing of mmrl), so that rewards, the core and both adapters share it; the core re-exports it
as `mmrl.registry`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from typing import Any, Callable, Generic, Iterable, TypeVar

T = TypeVar("T")


class LookupFailed(ValueError, KeyError):
    """A name or reference that does not resolve; the message says what would be valid."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def is_reference(name: str) -> bool:
    """True for 'module:attr' / 'file.py:attr', False for a registered name."""
    return ":" in str(name)


def _key(field: str | None) -> str:
    return f"config key '{field}': " if field else ""


def _import_file(path: str, ref: str, field: str | None):
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise LookupFailed(f"{_key(field)}file {path!r} (from {ref!r}) does not exist")
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(full))[0])
    name = f"mmrl_user_{stem}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"
    if name in sys.modules:               # one module per file: registrations and state are not repeated
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise LookupFailed(f"{_key(field)}running {path!r} (from {ref!r}) failed: "
                           f"{type(e).__name__}: {e}") from e
    return module


def _import_module(target: str, ref: str, field: str | None):
    try:
        return importlib.import_module(target)
    except ImportError as e:
        raise LookupFailed(f"{_key(field)}cannot import module {target!r} (from {ref!r}): {e}") from e


def load_object(ref: str, field: str | None = None) -> Any:
    """'package.module:attr' or 'path/to/file.py:attr' -> the object; a plain 'package.module' -> the module.

    `field` is the config key the reference came from; errors name it.
    """
    target, sep, attr = str(ref).rpartition(":")
    if not sep:
        target, attr = ref, ""
    if not target or (sep and not attr):
        raise LookupFailed(f"{_key(field)}{ref!r} must look like 'package.module:attr' or 'path/to/file.py:attr'")
    module = (_import_file(target, ref, field) if target.endswith(".py")
              else _import_module(target, ref, field))
    obj = module
    for part in attr.split(".") if attr else []:
        if not hasattr(obj, part):
            raise LookupFailed(f"{_key(field)}{target!r} has no attribute {attr!r} (from {ref!r})")
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T], dict):
    """A `dict` of name -> object (or lazy import string) whose failed look-up lists the valid names.

    kind:        what the entries are, for messages ("advantage estimator").
    references:  whether `resolve` also accepts 'module:attr' / 'file.py:attr' (user plug-ins).
    on_first_use: called once before the first look-up (e.g. to import the modules that register
                 the built-in entries).
    """

    def __init__(self, kind: str, *, references: bool = False, on_first_use: Callable[[], None] | None = None):
        super().__init__()
        self.kind = kind
        self.references = references
        self._on_first_use = on_first_use

    def _ready(self) -> None:
        if self._on_first_use is not None:
            hook, self._on_first_use = self._on_first_use, None
            hook()

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@REGISTRY.register("name")`; a name taken by another object is an error."""

        def deco(obj: T) -> T:
            if name in self and dict.__getitem__(self, name) is not obj:
                raise ValueError(f"{self.kind} name {name!r} is already registered "
                                 f"by {dict.__getitem__(self, name)!r}")
            self[name] = obj
            return obj

        return deco

    def names(self) -> list[str]:
        self._ready()
        return sorted(self)

    def valid(self) -> str:
        """The valid names as one phrase, for messages."""
        names = ", ".join(self.names())
        return names + (" (or 'module:attr' / 'path/to/file.py:attr')" if self.references else "")

    def check(self, name: str, field: str | None = None) -> None:
        """Raise `LookupFailed` unless `name` is registered (or, with references, looks like one)."""
        self._ready()
        if name in self or (self.references and is_reference(name)):
            return
        raise LookupFailed(f"{_key(field)}unknown {self.kind} {name!r}; valid names: {self.valid()}")

    def resolve(self, name: str, field: str | None = None) -> T:
        """The object for a registered name (lazy strings imported now), or a loaded reference."""
        self.check(name, field)
        if name not in self:
            return load_object(name, field)
        value = dict.__getitem__(self, name)
        if isinstance(value, str):
            value = load_object(value, field)
            self[name] = value
        return value



def summary_doc(obj: Any) -> str:
    """The first paragraph of an object's docstring on one line ('' without one), for listings and the docs."""
    import inspect

    return " ".join((inspect.getdoc(obj) or "").strip().split("\n\n")[0].split())


def unexpected_kwargs(fn: Callable, kwargs: Iterable[str], skip: int = 0) -> list[str]:
    """Keyword names `fn` would reject (empty when it takes **kwargs or cannot be inspected).

    skip: leading positional parameters filled by the caller (a reward's `samples`).
    """
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    named = {p.name for p in params[skip:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return sorted(k for k in kwargs if k not in named)
