"""Name -> reward registry (the config boundary) and resolution of user references.

A registered entry is either a plain reward `fn(samples, **kwargs) -> list[float | None]`
(kwargs from the config are passed on every call) or, with `factory=True`, a factory
`factory(**kwargs) -> reward` called once (heavy models are loaded there, lazily).
A reference 'module:attr' / 'file.py:attr' names a plain reward, or a factory when it is a
class or carries `_mmrl_factory = True`. A factory may carry `mmrl_validate(**kwargs)`: its checks
of the config entry, run when the config is loaded (before anything is built). A function written
for TRL, veRL or EasyR1 is called the way that framework calls it (`style`, rewards/styles.py).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

from rewards import styles
from rewards.lookup import LookupFailed, Registry, summary_doc, is_reference, unexpected_kwargs

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
        REGISTRY[name] = Entry(name, obj, factory, summary_doc(obj))
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
    return Entry(name, obj, factory, summary_doc(obj))


def check(name: str, kwargs: dict | None = None, field: str | None = None, style: str = "auto") -> Entry:
    """Validate a config entry without building it: the name resolves to something callable and,
    where the reward declares its parameters, every keyword argument is one of them (for a function
    written for another framework, `style`, none of the arguments that framework fills)."""
    e = entry(name, field)
    if not callable(e.obj):
        raise LookupFailed(f"{_where(field)}reward {name!r} resolves to {e.obj!r}, which is not callable")
    kwargs = kwargs or {}
    kind = "mmrl" if e.factory else (styles.detect(e.obj) if style == "auto" else style)
    clash = [k for k in kwargs if k in styles.own_arguments(kind)]
    if clash:
        raise LookupFailed(f"{_where(field)}reward {name!r} ({kind} style): {', '.join(map(repr, clash))} "
                           f"{'is' if len(clash) == 1 else 'are'} filled by the {kind} caller; remove "
                           f"{'it' if len(clash) == 1 else 'them'} from the entry")
    skip = 0 if e.factory or kind != "mmrl" else 1
    bad = unexpected_kwargs(e.obj, kwargs, skip=skip)
    if bad:
        params = [p for p in _parameters(e.obj)[skip:] if p not in styles.own_arguments(kind)]
        raise LookupFailed(f"{_where(field)}reward {name!r} takes no argument {', '.join(map(repr, bad))}; "
                           f"its arguments: {', '.join(params) or 'none'}")
    validate = getattr(e.obj, "mmrl_validate", None)           # a factory's own checks, before it loads anything
    if validate is not None:
        try:
            validate(**kwargs)
        except ValueError as err:
            raise LookupFailed(f"{_where(field)}{err}") from None
    return e


def resolve(name: str, kwargs: dict | None = None, style: str = "auto") -> RewardFn:
    """Build the reward callable for a config entry's `name`, keyword arguments and `style` (a
    function written for another framework comes back as a native reward; rewards/styles.py)."""
    kwargs = dict(kwargs or {})
    e = check(name, kwargs, style=style)
    if e.factory:
        try:
            fn = e.obj(**kwargs)
        except TypeError as err:
            raise ValueError(f"reward {name!r}: bad arguments {sorted(kwargs)}: {err}") from err
        except (OSError, ImportError, RuntimeError) as err:  # weights that cannot be found or loaded
            raise ValueError(f"reward {name!r}: building it with arguments {sorted(kwargs)} failed: "
                             f"{type(err).__name__}: {err}") from err
    else:
        fn = functools.partial(e.obj, **kwargs) if kwargs else e.obj
    return styles.adapt(fn, styles.detect(fn if e.factory else e.obj) if style == "auto" else style)


def _where(field: str | None) -> str:
    return f"config key '{field}': " if field else ""


def _parameters(fn) -> list[str]:
    try:
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        return []


__all__ = ["Entry", "REGISTRY", "check", "entry", "is_reference", "register", "registered", "resolve"]
