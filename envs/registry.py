"""Environment name -> `gymnasium.Env`: the built-ins, `gym:<id>`, and user references.

A config names an environment as a registered name (bandit, frozenlake, sokoban), `gym:<id>` for
any installed gymnasium env with a Discrete action space, or a reference 'module:attr' /
'path/to/file.py:attr' to a class or factory called with the config's keyword arguments.
`check_env` validates all of that without building anything (when a config is loaded);
`make_env` builds. Every error is a `ValueError` starting "config key '<field>': ".
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from rewards.lookup import LookupFailed, Registry, is_reference, unexpected_kwargs

GYM_PREFIX = "gym:"
# arguments of gymnasium.make itself, accepted beside the env's own; render_mode is the adapter's
MAKE_KWARGS = ("max_episode_steps", "disable_env_checker")

ENVIRONMENTS: Registry[Any] = Registry("environment", references=True)
ENVIRONMENTS.update({
    "bandit": "envs.bandit:Bandit",
    "frozenlake": "envs.frozenlake:FrozenLake",
    "sokoban": "envs.sokoban:Sokoban",
    "signal": "envs.games:SignalGame",        # two roles in turn: speaker and listener (multi-role)
    "matching": "envs.games:MatchingGame",    # two roles at once (multi-role)
})


def _key(field: str) -> str:
    return f"config key '{field}': "


def _kwarg_key(field: str, kwarg: str) -> str:
    """'env.name' + 'size' -> "config key 'env.size': "."""
    section = field.rpartition(".")[0]
    return _key(f"{section}.{kwarg}" if section else kwarg)


def _valid_names() -> str:
    return (f"{', '.join(ENVIRONMENTS.names())}, 'gym:<id>' (an installed gymnasium environment), "
            f"or a reference 'module:attr' / 'path/to/file.py:attr'")


def _parameters(fn: Callable) -> str:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return "unknown"
    return ", ".join(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or "none"


def _reject_kwargs(what: str, fn: Callable, kwargs: dict, field: str, allowed: tuple[str, ...] = (),
                   preset: dict | None = None) -> None:
    """A `LookupFailed` naming the first keyword argument `fn` would reject, or a required one missing.

    allowed: names taken by the caller rather than `fn`; preset: arguments the caller adds itself.
    """
    bad = [k for k in unexpected_kwargs(fn, kwargs) if k not in allowed]
    if bad:
        raise LookupFailed(f"{_kwarg_key(field, bad[0])}{what} takes no argument {', '.join(map(repr, bad))}; "
                           f"its arguments: {_parameters(fn)}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**{**(preset or {}), **{k: v for k, v in kwargs.items() if k not in allowed}})
    except TypeError as e:
        given = f"keyword arguments {', '.join(sorted(kwargs))}" if kwargs else "no keyword arguments"
        raise LookupFailed(f"{_key(field)}{what} cannot be built with {given}: {e}; "
                           f"its arguments: {_parameters(fn)}") from e


def _gym_id(name: str, field: str) -> str:
    gym_id = name[len(GYM_PREFIX):].strip()
    try:
        gym.spec(gym_id)
    except gym.error.Error as e:
        close = difflib.get_close_matches(gym_id, list(gym.registry), n=5, cutoff=0.5)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise LookupFailed(f"{_key(field)}{name!r} is not a registered gymnasium environment ({e}){hint}") from e
    return gym_id


def _check_gym(name: str, kwargs: dict, field: str) -> str:
    gym_id = _gym_id(name, field)
    if "render_mode" in kwargs:
        raise LookupFailed(f"{_kwarg_key(field, 'render_mode')}render_mode is set by the adapter "
                           f"('rgb_array', for the image); remove it")
    spec = gym.spec(gym_id)
    try:
        creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    except (ImportError, gym.error.Error) as e:
        raise LookupFailed(f"{_key(field)}gymnasium environment {gym_id!r} cannot be imported "
                           f"({type(e).__name__}: {e}); install its dependencies") from e
    if not callable(creator):
        raise LookupFailed(f"{_key(field)}gymnasium environment {gym_id!r} has no entry point to build it from")
    _reject_kwargs(f"gymnasium environment {gym_id!r}", creator, kwargs, field, MAKE_KWARGS, preset=spec.kwargs)
    return gym_id


def _resolve(name: str, field: str) -> Callable:
    """The class or factory of a registered name or reference (imported, not called)."""
    if not isinstance(name, str) or not name.strip():
        raise LookupFailed(f"{_key(field)}expected an environment name, got {name!r}; valid names: {_valid_names()}")
    if name not in ENVIRONMENTS and not is_reference(name):
        raise LookupFailed(f"{_key(field)}unknown environment {name!r}; valid names: {_valid_names()}")
    obj = ENVIRONMENTS.resolve(name, field)
    if not callable(obj):
        raise LookupFailed(f"{_key(field)}environment {name!r} resolves to {obj!r}, which is not callable; "
                           f"expected a gymnasium.Env class or a factory returning one")
    return obj


def check_env(name: str, kwargs: dict | None = None, field: str = "env.name") -> None:
    """Raise a `ValueError` naming the config key unless `name` with `kwargs` would build.

    Checks without building: the name resolves (references are imported, not called), a `gym:<id>`
    is registered in gymnasium, and every keyword argument is one the env accepts.
    """
    kwargs = dict(kwargs or {})
    if isinstance(name, str) and name.startswith(GYM_PREFIX):
        _check_gym(name, kwargs, field)
        return
    _reject_kwargs(f"environment {name!r}", _resolve(name, field), kwargs, field)


def _check_built(env: Any, name: str, field: str) -> gym.Env:
    if not isinstance(env, gym.Env):
        raise LookupFailed(f"{_key(field)}environment {name!r} built {type(env).__name__} {env!r}, "
                           f"not a gymnasium.Env; expected a gymnasium.Env with reset(seed=...) and step(action_text)")
    missing = [m for m in ("reset", "step") if getattr(type(env), m, None) is getattr(gym.Env, m)]
    if missing:
        raise LookupFailed(f"{_key(field)}environment {name!r} ({type(env).__name__}) does not define "
                           f"{' or '.join(missing)}; a gymnasium.Env must implement reset(seed=...) and step(action)")
    return env


def _make_gym(name: str, kwargs: dict, field: str) -> gym.Env:
    from envs.gym_adapter import GymAdapter

    gym_id = _check_gym(name, kwargs, field)
    env = gym.make(gym_id, render_mode="rgb_array", **kwargs)
    try:
        return GymAdapter(env)
    except ValueError as e:
        env.close()
        raise LookupFailed(f"{_key(field)}{e}") from e


def make_env(name: str, kwargs: dict | None = None, field: str = "env.name") -> gym.Env:
    """Build the environment a config names: a registered name, 'gym:<id>', or 'module:attr' / 'file.py:attr'."""
    kwargs = dict(kwargs or {})
    if isinstance(name, str) and name.startswith(GYM_PREFIX):
        return _make_gym(name, kwargs, field)
    factory = _resolve(name, field)
    _reject_kwargs(f"environment {name!r}", factory, kwargs, field)
    try:
        env = factory(**kwargs)
    except ValueError as e:
        raise LookupFailed(f"{_key(field)}building environment {name!r} with {kwargs} failed: {e}") from e
    return _check_built(env, name, field)
