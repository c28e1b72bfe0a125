"""Objectives: what the learner minimises on one step's batch, one registered entry per file (`algo.objective`).

    pg         the policy gradient over per-action log-probs (pg.py): a policy loss (`algo.policy_loss`), the KL
               and entropy terms and the aggregation, for every adapter.
    decoupled  AReaL's decoupled PPO (decoupled.py): pg's loss with the ratio anchored at the proximal policy
               (recomputed before the update) and each action weighted by pi_prox / pi_behav, for stale samples.
    nft        DiffusionNFT's forward-process loss on the clean samples (nft.py), for flow-matching policies.

An entry is an `Objective`:

    build(inp: ObjectiveInput) -> loss_of(idx, epoch, norm) -> (loss, metrics)
    after_update(policy, algo, step) -> metrics           (None: nothing to do once the step's updates are done)
    check(algo) -> None                                   (ConfigError at load for keys the objective refuses)

`build` runs once per step, before any weight changes (what must be computed from the sampling weights, the
reference's log-probs for instance, is computed there); `loss_of` is called per microbatch of indices `idx`
into the step's batch, with the update epoch and the optimizer step's totals (`mmrl.algorithms.losses.Normalizer`)
and returns the microbatch's share of the step loss. The learner (`mmrl.loop.update`) runs the epochs, the
optimizer and the EMA around it, the same for every objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from mmrl.registry import Registry


@dataclass(frozen=True)
class ObjectiveInput:
    """What an objective reads to build its microbatch loss.

    policy:        the adapter's policy.
    algo:          the `algo` config section.
    batch:         the step's `StepBatch` (rollout, advantages [N], per-action advantages [N, T] or None).
    advantages:    [N] or [N, T] on the policy's device (per-action credit where the batch has it).
    old_log_probs: () -> [N, T] log pi_old, or None where they are the first training forward's own values
                   (a single on-policy pass); called by the objectives that need them, once.
    recompute_log_probs: () -> [N, T] log-probs of the current weights, always computed: a no-grad pass of
                   `policy.log_probs` over the whole batch in microbatches of train.samples_per_microbatch, under
                   autocast (the proximal policy of `decoupled`); call it in `build`, before any update.
    """

    policy: Any
    algo: Any
    batch: Any
    advantages: torch.Tensor
    old_log_probs: Callable[[], "torch.Tensor | None"]
    recompute_log_probs: Callable[[], torch.Tensor]


@dataclass(frozen=True)
class Objective:
    build: Callable[[ObjectiveInput], Callable]
    after_update: Callable | None = None
    check: Callable | None = None


def _builtins() -> None:
    from mmrl.algorithms.objectives import decoupled, nft, pg  # noqa: F401  (their decorators register the entries)


OBJECTIVES: Registry = Registry("objective", on_first_use=_builtins)


def register(name: str, *, after_update: Callable | None = None, check: Callable | None = None) -> Callable:
    """Decorator on an objective's `build(inp) -> loss_of`."""

    def deco(build: Callable) -> Callable:
        OBJECTIVES.register(name)(Objective(build, after_update, check))
        return build

    return deco


def resolve(name: str) -> Objective:
    return OBJECTIVES.resolve(name, "algo.objective")
