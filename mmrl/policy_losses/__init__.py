"""Policy losses: the per-action surrogate of the policy-gradient objective, one registered entry per algorithm.

Every entry has one signature,

    loss(inp: SurrogateInput, spec: LossSpec) -> (l [n, T], metrics)

where `l` is the per-action loss before aggregation (the core aggregates it with algo.aggregation, adds the
KL and entropy terms, and applies GRPO-Guard's step weights and the rollout correction's importance weights),
and `metrics` maps names to `mmrl.reduce.Metric`s (plain numbers count as means over this batch's actions).
`algo.policy_loss` names the entry: a registered name (`POLICY_LOSSES.names()`), 'package.module:fn' or
'path/to/file.py:fn' (a user's loss, a plain function with that signature). A built-in entry is a `PolicyLoss`,
which also carries the load-time check of the algo keys the loss reads or refuses; each lives in a file of its
own in this package (ppo_clip.py, cispo.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from mmrl.reduce import Metric, weighted_mean
from mmrl.registry import Registry


@dataclass(frozen=True)
class SurrogateInput:
    """What a policy loss reads, all [n, T] fp32 on the scores' device.

    logp:  log pi_theta of each action, with grad.
    old:   log pi_old (the policy that sampled, or the last update's), no grad.
    adv:   the advantage of each action (a sample's advantage repeated, or turn-level credit).
    mask:  1 for actions, 0 for padding and context.
    guard: GRPO-Guard's RatioNorm terms (step std s, mean drift b) when algo.ratio_norm, else None.
    """

    logp: torch.Tensor
    old: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor
    guard: tuple | None = None


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss: `fn(inp, spec) -> (l, metrics)` and `check(algo)`, which raises
    ConfigError at load for algo keys this loss cannot honour (None: it reads only what every loss reads)."""

    fn: Callable
    check: Callable | None = None


RATIO_LEVELS: Registry = Registry("ratio level")


@RATIO_LEVELS.register("token")
def token_ratio(log_r: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log r per action (PPO, GRPO): [n, T] -> [n, T]."""
    return log_r


@RATIO_LEVELS.register("sequence")
def sequence_ratio(log_r: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence ratio (arXiv 2507.18071): log s = mean_t log r over the sample's actions, shared by them.
    [n, T] -> [n, T]."""
    seq = (log_r * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)   # [n, 1]
    return seq.expand_as(log_r)                                                          # [n, T]


def _builtins() -> None:
    from mmrl.policy_losses import cispo, ppo_clip  # noqa: F401  (their decorators register the entries)


POLICY_LOSSES: Registry = Registry("policy loss", references=True, on_first_use=_builtins)


def register(name: str, check: Callable | None = None) -> Callable:
    """Decorator: `@register("name", check=...)` on a `fn(inp, spec) -> (l, metrics)`."""

    def deco(fn: Callable) -> Callable:
        POLICY_LOSSES.register(name)(PolicyLoss(fn, check))
        return fn

    return deco


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
