"""Name -> reward registry (the config boundary) and resolution of user references.

A registered entry is either a plain reward `fn(samples, **kwargs) -> list[float | None]`
(kwargs from the config are passed on every call) or, with `factory=True`, a factory
`factory(**kwargs) -> reward` called once (heavy models are loaded there, lazily).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable

RewardFn = Callable[[list], list]


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Callable
    factory: bool
    doc: str


REGISTRY: dict[str, Entry] = {}
_BUILTINS_LOADED = False


def register(name: str, *, factory: bool = False):
    """Decorator: `@rewards.register("name")` (plain reward) or `(..., factory=True)`."""

    def deco(obj):
        if name in REGISTRY and REGISTRY[name].obj is not obj:
            raise ValueError(f"reward name {name!r} is already registered by {REGISTRY[name].obj!r}")
        doc = (inspect.getdoc(obj) or "").strip().splitlines()
        REGISTRY[name] = Entry(name, obj, factory, doc[0] if doc else "")
        return obj

    return deco


def load_builtins() -> None:
    """Import the modules that register the built-in rewards (once)."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    from rewards import builtin  # noqa: F401  (registers on import)


def registered() -> dict[str, Entry]:
    load_builtins()
    return dict(sorted(REGISTRY.items()))


def _load_object(ref: str) -> Any:
    """`package.module:function` or `path/to/file.py:function` -> the object."""
    target, _, attr = ref.rpartition(":")
    if not target or not attr:
        raise ValueError(f"reward reference {ref!r} must look like 'module:function' or 'file.py:function'")
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise ValueError(f"reward file {target!r} (from {ref!r}) does not exist")
        mod_name = "mmrl_user_reward_" + os.path.splitext(os.path.basename(target))[0]
        spec = importlib.util.spec_from_file_location(mod_name, target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(f"cannot import module {target!r} for reward {ref!r}: {e}") from e
    if not hasattr(module, attr):
        raise ValueError(f"{target!r} has no attribute {attr!r} (reward {ref!r})")
    return getattr(module, attr)


def resolve(name: str, kwargs: dict | None = None) -> RewardFn:
    """Build the reward callable for a config entry's `name` and keyword arguments."""
    kwargs = dict(kwargs or {})
    if ":" in name:
        obj = _load_object(name)
        is_factory = inspect.isclass(obj) or getattr(obj, "_mmrl_factory", False)
    else:
        entries = registered()
        if name not in entries:
            raise ValueError(f"unknown reward {name!r}; registered rewards: {', '.join(entries)} "
                             "(or use 'module:function' / 'path/to/file.py:function')")
        obj, is_factory = entries[name].obj, entries[name].factory
    if not callable(obj):
        raise ValueError(f"reward {name!r} resolves to {obj!r}, which is not callable")
    if is_factory:
        try:
            return obj(**kwargs)
        except TypeError as e:
            raise ValueError(f"reward {name!r}: bad arguments {sorted(kwargs)}: {e}") from e
    return functools.partial(obj, **kwargs) if kwargs else obj
