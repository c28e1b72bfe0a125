"""The learning role (`Learner`): `update_epochs` passes of shuffled microbatches, gradient accumulation up to
each optimizer step, grad-norm clipping, non-finite step skipping, the EMA of the weights after each applied
optimizer step (`mmrl.loop.ema`); the same loop for every objective (`algo.objective`,
`mmrl.algorithms.objectives`: the policy gradient, AReaL's decoupled PPO, DiffusionNFT's forward-process loss)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

import torch

from mmrl.algorithms import objectives
from mmrl.algorithms.losses import Normalizer
from mmrl.distributed import memory, sharding
from mmrl.distributed.dist import all_reduce
from mmrl.distributed.reduce import Accumulator, Metric, maximum, mean


class NonFiniteError(RuntimeError):
    """Too many optimizer steps in a row had NaN/inf loss or gradients."""


@dataclass
class Counters:
    """The learner's step counters, saved in every checkpoint's state.json (as a plain mapping).

    skipped: optimizer steps skipped for a non-finite loss or gradient, over the whole run.
    streak:  how many of the latest optimizer steps in a row were skipped (stops the run at
             optim.max_nonfinite_in_a_row).
    """

    skipped: int = 0
    streak: int = 0

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        unknown = sorted(set(state) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"checkpoint counters {unknown} are not counters of this version "
                             f"({', '.join(f.name for f in dataclasses.fields(self))})")
        for key, value in state.items():
            setattr(self, key, int(value))


def samples_per_optimizer_step(train, n: int) -> int:
    """Samples in one optimizer step of a process whose step batch has `n` samples:
    `samples_per_microbatch * grad_accum_steps`, or all `n` when grad_accum_steps is 0."""
    per_opt = train.samples_per_microbatch * train.grad_accum_steps or n
    assert per_opt > 0, (train.samples_per_microbatch, train.grad_accum_steps, n)
    return per_opt


def _normalizer(mask: torch.Tensor, max_len_norm: int | None, world_size: int) -> Normalizer:
    """Sequence and action totals of one optimizer step over all processes."""
    seqs, tokens = all_reduce([float(mask.shape[0]), float(mask.sum())], "sum")
    return Normalizer(seqs, tokens, float(max_len_norm or mask.shape[1]), world_size)


def optimizer_step(params: list, optimizer, scheduler, ema, optim, loss_total: float, counters: Counters) -> float:
    """Clip, step (or skip a non-finite step), zero the gradients; returns the global gradient norm
    (over all shards under FSDP). `optim`: the optim config section; `ema` the average to update, or None."""
    limit = optim.max_grad_norm if optim.max_grad_norm > 0 else math.inf
    grad_norm = float(sharding.full(torch.nn.utils.clip_grad_norm_(params, limit)))
    if math.isfinite(grad_norm) and math.isfinite(loss_total):
        optimizer.step()
        scheduler.step()
        if ema is not None:
            ema.update()
        counters.streak = 0
    else:
        counters.skipped += 1
        counters.streak += 1
        if counters.streak >= optim.max_nonfinite_in_a_row:
            raise NonFiniteError(
                f"{counters.streak} optimizer steps in a row had a non-finite loss or gradient "
                f"(optim.max_nonfinite_in_a_row={optim.max_nonfinite_in_a_row}); stopping. The last "
                "checkpoint is intact; try a lower optim.lr or optim.max_grad_norm.")
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


class Learner:
    """The learning role: update epochs over a `StepBatch`, the optimizer, scheduler and EMA, and the counters;
    its own state for checkpoints (`state_dict`). Built from explicit parts:

    policy:               the adapter's policy (log_probs, reference_log_probs, forward_process_loss).
    optimizer, scheduler: over `params`, the trainable parameters; `ema` their average, or None.
    accelerator:          autocast, backward, no_sync and the process count.
    train, optim, algo:   the config sections it reads (epochs and microbatches; clipping and the non-finite
                          limit; the loss and its options).
    seed:                 the run seed (each step's microbatch order comes from (seed, step)).
    `version` counts the updates applied; the generator receives it with the new weights.
    """

    def __init__(self, *, policy, optimizer, scheduler, params: list, accelerator, ema, train, optim, algo, seed: int):
        self.policy, self.optimizer, self.scheduler, self.params = policy, optimizer, scheduler, params
        self.accelerator, self.ema = accelerator, ema
        self.train, self.optim, self.algo, self.seed = train, optim, algo, seed
        self.counters = Counters()
        self.version = 0

    def state_dict(self) -> dict:
        return {"counters": self.counters.state_dict()}

    def members(self) -> dict:
        """Policies trained beside this one (a team's, `mmrl.loop.team.TeamLearner`): none."""
        return {}

    def published(self) -> list:
        """The tensors an asynchronous rollout worker samples with: the trainable parameters."""
        return list(self.params)

    def load_state_dict(self, state: dict) -> None:
        self.counters.load_state_dict(state["counters"])

    def _old_log_probs(self, ro, single_pass: bool) -> torch.Tensor | None:
        """[N, T] rollout-time log-probs; None when they are the first training forward's own values.

        An adapter that defers them (`Rollout.log_probs is None`) gets them here: in a single
        on-policy pass (one epoch, one optimizer step) every sample is scored once before any weight
        changes, so the old log-probs are the new ones detached (TRL does the same for
        num_iterations=1) and no extra forward runs; otherwise one no-grad pass of the same forward.
        """
        if ro.log_probs is not None or single_pass:
            return ro.log_probs
        return self._no_grad_log_probs(ro)

    def _no_grad_log_probs(self, ro) -> torch.Tensor:
        """[N, T] log-probs of the rollout's actions under the current weights: one no-grad pass of the training
        forward in microbatches of train.samples_per_microbatch, under autocast."""
        mb = self.train.samples_per_microbatch
        with torch.no_grad(), self.accelerator.autocast():
            return torch.cat([self.policy.log_probs(ro, idx).log_probs for idx in torch.arange(len(ro)).split(mb)])

    def update(self, batch, step: int) -> dict[str, Metric]:
        """Optimise the policy on one step's batch; returns the update metrics, merged over this process's
        microbatches (the trainer merges processes). algo.objective picks the microbatch loss
        (`mmrl.algorithms.objectives`) and what runs after the step's updates (DiffusionNFT's old-policy update)."""
        acc, policy, train = self.accelerator, self.policy, self.train
        ro = batch.rollout
        adv = (batch.advantages if batch.action_advantages is None else batch.action_advantages).to(acc.device)
        n = len(ro)                                                               # adv: [N] or [N, T]
        if n == 0:
            return {"update/skipped_empty": mean(1)}
        objective = objectives.resolve(self.algo.objective)
        mb = train.samples_per_microbatch
        per_opt = samples_per_optimizer_step(train, n)
        single_pass = train.update_epochs == 1 and per_opt >= n
        loss_of = objective.build(objectives.ObjectiveInput(
            policy=policy, algo=self.algo, batch=batch, advantages=adv,
            old_log_probs=lambda: self._old_log_probs(ro, single_pass),
            recompute_log_probs=lambda: self._no_grad_log_probs(ro)))
        gen = torch.Generator().manual_seed(self.seed * 7_919 + step)
        metrics, first_dev = Accumulator(), None
        for epoch in range(train.update_epochs):
            perm = torch.randperm(n, generator=gen)                                   # [N]
            for chunk in perm.split(per_opt):
                norm = _normalizer(ro.mask[chunk], self.algo.max_len_norm, acc.num_processes)
                micro = chunk.split(mb)
                loss_total = 0.0
                for i, idx in enumerate(micro):
                    # FSDP reduce-scatters every microbatch's gradients (an unsynced FSDP backward keeps whole
                    # gradients); DDP all-reduces only the last one's
                    last = i == len(micro) - 1 or sharding.is_sharded(policy.model)
                    sync = contextlib.nullcontext() if last else acc.no_sync(policy.model)
                    with sync, acc.autocast():
                        loss, m = loss_of(idx, epoch, norm)
                        acc.backward(loss)
                    loss_total += float(loss.detach())
                    if first_dev is None and "ratio/max_abs_dev" in m:
                        first_dev = float(m["ratio/max_abs_dev"].value)
                    metrics.add(m)
                grad_bytes = memory.grads_bytes(self.params)                          # this process's, before the step
                grad_norm = optimizer_step(self.params, self.optimizer, self.scheduler, self.ema, self.optim,
                                           loss_total, self.counters)
                metrics.add({"loss": mean(loss_total), "grad_norm": mean(grad_norm),
                             "mem/grads_bytes": maximum(grad_bytes)})
        if first_dev is not None:
            metrics.add({"ratio/first_max_abs_dev": maximum(first_dev)})
        if objective.after_update is not None:
            metrics.add(objective.after_update(policy, self.algo, step))
        metrics.add({"nonfinite/skipped": mean(self.counters.skipped),
                     "optim/lr": mean(self.scheduler.get_last_lr()[0])})
        self.version += 1
        return metrics.metrics()

