"""Policy losses: the per-action surrogate of the policy-gradient objective, one registered entry per algorithm.

Every entry has one signature,

    loss(inp: SurrogateInput, spec: LossSpec) -> (l [n, T], metrics)

where `l` is the per-action loss before aggregation (the core aggregates it with algo.aggregation, adds the
KL and entropy terms, and applies GRPO-Guard's step weights and the rollout correction's importance weights),
and `metrics` maps names to `mmrl.distributed.reduce.Metric`s (plain numbers count as means over this batch's
actions).
`algo.policy_loss` names the entry: a registered name (`POLICY_LOSSES.names()`), 'package.module:fn' or
'path/to/file.py:fn' (a user's loss, a plain function with that signature). A built-in entry is a `PolicyLoss`,
which also carries the load-time check of the algo keys the loss reads or refuses and whether it needs
GRPO-Guard's terms; each lives in a file of its own in this package: ppo_clip.py (PPO/GRPO, DAPO clip-higher),
dual_clip.py, gspo.py, grpo_guard.py, cispo.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from mmrl.distributed.reduce import Metric, weighted_mean
from mmrl.errors import ConfigError
from mmrl.registry import Registry


@dataclass(frozen=True)
class SurrogateInput:
    """What a policy loss reads, all [n, T] fp32 on the scores' device.

    logp:  log pi_theta of each action, with grad.
    old:   log pi_old (the policy that sampled, or the last update's), no grad.
    adv:   the advantage of each action (a sample's advantage repeated, or turn-level credit).
    mask:  1 for actions, 0 for padding and context.
    guard: GRPO-Guard's RatioNorm terms (step std s, mean drift b) for a loss registered with ratio_norm=True
           (grpo_guard), else None.
    """

    logp: torch.Tensor
    old: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor
    guard: tuple | None = None


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: `fn(inp, spec) -> (l, metrics)`; `check(algo)`, which raises ConfigError at
    load for algo keys this loss cannot honour (None: it reads only what every loss reads); `ratio_norm`: the loss
    reads GRPO-Guard's terms (`SurrogateInput.guard`), so the adapter records the rollout's step means."""

    fn: Callable
    check: Callable | None = None
    ratio_norm: bool = False


def _builtins() -> None:
    # importing the entries' files runs their decorators, which register them
    from mmrl.algorithms.policy_losses import cispo, dual_clip, grpo_guard, gspo, ppo_clip  # noqa: F401


POLICY_LOSSES: Registry = Registry("policy loss", references=True, on_first_use=_builtins)


def register(name: str, check: Callable | None = None, ratio_norm: bool = False) -> Callable:
    """Decorator: `@register("name", check=..., ratio_norm=...)` on a `fn(inp, spec) -> (l, metrics)`."""

    def deco(fn: Callable) -> Callable:
        POLICY_LOSSES.register(name)(PolicyLoss(fn, check, ratio_norm))
        return fn

    return deco


def no_dual_clip(algo, name: str) -> None:
    """algo.dual_clip is the constant of the dual_clip loss; any other loss refuses it (ConfigError)."""
    if algo.dual_clip is not None:
        raise ConfigError(f"config key 'algo.dual_clip' ({algo.dual_clip}) is the constant of "
                          f"algo.policy_loss=dual_clip; with algo.policy_loss={name} set algo.dual_clip=null "
                          "(or algo.policy_loss=dual_clip)")


def resolve(name: str, field: str = "algo.policy_loss") -> PolicyLoss:
    """The entry of a registered name, or a user's function (from a reference) as a `PolicyLoss`."""
    entry = POLICY_LOSSES.resolve(name, field)
    if isinstance(entry, PolicyLoss):
        return entry
    if not callable(entry):
        raise ValueError(f"config key '{field}': {name!r} is a {type(entry).__name__}, not a function "
                         "fn(inp: SurrogateInput, spec: LossSpec) -> (loss [n, T], metrics)")
    return PolicyLoss(entry)


def surrogate(name: str, inp: SurrogateInput, spec) -> tuple[torch.Tensor, dict[str, Metric]]:
    """The per-action loss l [n, T] of policy loss `name` and its metrics (plain numbers wrapped as means over
    this batch's actions); a wrong shape is an error naming the loss."""
    l, metrics = resolve(name).fn(inp, spec)
    if not isinstance(l, torch.Tensor) or l.shape != inp.mask.shape:
        got = tuple(l.shape) if isinstance(l, torch.Tensor) else type(l).__name__
        raise ValueError(f"policy loss {name!r} returned a loss of shape {got}; it must be per action, "
                         f"{tuple(inp.mask.shape)} ([n, T], not yet aggregated)")
    n_tok = inp.mask.sum()
    return l, {k: v if isinstance(v, Metric) else weighted_mean(v, n_tok) for k, v in dict(metrics).items()}
