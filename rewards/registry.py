"""Name -> reward registry (the config boundary) and resolution of user references.

A registered entry is either a plain reward `fn(samples, **kwargs) -> list[float | None]`
(kwargs from the config are passed on every call) or, with `factory=True`, a factory
`factory(**kwargs) -> reward` called once (heavy models are loaded there, lazily).
A reference 'module:attr' / 'file.py:attr' names a plain reward, or a factory when it is a
class or carries `_mmrl_factory = True`.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

from rewards.lookup import LookupFailed, Registry, first_line_doc, is_reference, unexpected_kwargs

RewardFn = Callable[[list], list]


@dataclass(frozen=True)
class Entry:
    name: str
    obj: Callable
    factory: bool
    doc: str


def load_builtins() -> None:
    """Import the modules that register the built-in rewards."""
    from rewards import builtin  # noqa: F401  (registers on import)


REGISTRY: Registry[Entry] = Registry("reward", references=True, on_first_use=load_builtins)


def register(name: str, *, factory: bool = False):
    """Decorator: `@rewards.register("name")` (plain reward) or `(..., factory=True)`."""

    def deco(obj):
        if name in REGISTRY and REGISTRY[name].obj is not obj:
            raise ValueError(f"reward name {name!r} is already registered by {REGISTRY[name].obj!r}")
        REGISTRY[name] = Entry(name, obj, factory, first_line_doc(obj))
        return obj

    return deco


def registered() -> dict[str, Entry]:
    return {n: REGISTRY[n] for n in REGISTRY.names()}


def entry(name: str, field: str | None = None) -> Entry:
    """The entry of a registered name or of a reference (imported, not called)."""
    obj = REGISTRY.resolve(name, field)
    if isinstance(obj, Entry):
        return obj
    factory = inspect.isclass(obj) or bool(getattr(obj, "_mmrl_factory", False))
    return Entry(name, obj, factory, first_line_doc(obj))


def check(name: str, kwargs: dict | None = None, field: str | None = None) -> Entry:
    """Validate a config entry without building it: the name resolves to something callable and,
    where the reward declares its parameters, every keyword argument is one of them."""
    e = entry(name, field)
    if not callable(e.obj):
        raise LookupFailed(f"{_where(field)}reward {name!r} resolves to {e.obj!r}, which is not callable")
    bad = unexpected_kwargs(e.obj, kwargs or {}, skip=0 if e.factory else 1)
    if bad:
        params = [p for p in _parameters(e.obj)[0 if e.factory else 1:]]
        raise LookupFailed(f"{_where(field)}reward {name!r} takes no argument {', '.join(map(repr, bad))}; "
                           f"its arguments: {', '.join(params) or 'none'}")
    return e


def resolve(name: str, kwargs: dict | None = None) -> RewardFn:
    """Build the reward callable for a config entry's `name` and keyword arguments."""
    kwargs = dict(kwargs or {})
    e = check(name, kwargs)
    if e.factory:
        try:
            return e.obj(**kwargs)
        except TypeError as err:
            raise ValueError(f"reward {name!r}: bad arguments {sorted(kwargs)}: {err}") from err
        except (OSError, ImportError, RuntimeError) as err:  # weights that cannot be found or loaded
            raise ValueError(f"reward {name!r}: building it with arguments {sorted(kwargs)} failed: "
                             f"{type(err).__name__}: {err}") from err
    return functools.partial(e.obj, **kwargs) if kwargs else e.obj


def _where(field: str | None) -> str:
    return f"config key '{field}': " if field else ""


def _parameters(fn) -> list[str]:
    try:
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        return []


__all__ = ["Entry", "REGISTRY", "check", "entry", "is_reference", "register", "registered", "resolve"]
