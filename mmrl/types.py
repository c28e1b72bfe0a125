"""The types every adapter and the core share: `Rollout`, `Scores`, `ForwardLoss`, `Reference`, `PromptBatch`,
`Policy`.

Layout convention: a rollout holds N = P * G samples ordered by group, sample i belonging
to prompt i // G; `group` records that index explicitly. T is the number of actions
(tokens for a VLM, trained denoising steps for diffusion).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Protocol, runtime_checkable

import torch

from mmrl.errors import ConfigError


@dataclass(frozen=True)
class PromptBatch:
    """The prompts of one rollout call.

    rows:   dataset records (dicts), one per prompt.
    index:  global dataset index of each prompt.
    step:   the training step (adapters with step-dependent schedules use it; -1 = eval).
    seeds:  one integer per prompt, derived from (run seed, step, position in the global
            batch) and never from the process rank, so sampling is identical on any
            number of processes.
    """

    rows: list[dict]
    index: list[int]
    seeds: list[int]
    step: int = 0

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class Rollout:
    """What a rollout records; everything needed to re-score it later.

    samples:    N reward `Sample`s (opaque to the core).
    log_probs:  [N, T] log-probs of the sampled actions at rollout time ("old"), or None when
                the adapter leaves them to the update (a sampler whose log-probs are not a by-product
                of sampling, like a VLM's generate): the core then takes them from the first
                training forward of a single on-policy pass, where they are that forward's own
                values, or computes them with the same forward, without grad, before updating.
    mask:       [N, T] 1 for real actions, 0 for padding.
    group:      [N] prompt position of each sample in this rollout.
    state:      adapter replay state: name -> tensor or list, each with leading dim N.
    engine_log_probs: [N, T] the sampled actions' log-probs as the engine that sampled them reported them,
                when that engine is not the trained forward (vLLM); None otherwise. The core compares
                them with the trainer's and weights the update by their ratio (`algo.rollout_correction`).
    versions:   [N, T] int64, the policy version (updates applied) of the weights that produced each action;
                filled by the generator (`mmrl.loop.collect`) where the adapter leaves it None. Asynchronous
                training bounds a trained action's staleness (the training step minus its version) with it.
    """

    samples: list
    log_probs: torch.Tensor | None
    mask: torch.Tensor
    group: torch.Tensor
    state: dict = field(default_factory=dict)
    engine_log_probs: torch.Tensor | None = None
    versions: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.mask.shape[0]

    @property
    def group_size(self) -> int:
        counts = torch.unique(self.group, return_counts=True)[1]
        if counts.numel() == 0 or not bool((counts == counts[0]).all()):
            raise ValueError(f"rollout groups have unequal sizes {counts.tolist()}")
        return int(counts[0])


@dataclass(frozen=True)
class Scores:
    """What `Policy.log_probs` returns for a microbatch.

    log_probs: [n, T] with grad.
    entropy:   [n, T] per-action entropy, or None when the adapter does not compute it.
    kl:        [n, T] exact per-action KL to the reference, computed by the adapter from the
               `Reference` it was handed (e.g. the Gaussian KL of two SDE steps), or None to let
               the core estimate it from `Reference.log_probs` (`algo.kl_estimator`).

    GRPO-Guard terms (`mmrl.algorithms.guard`), from adapters whose actions are Gaussian steps x' ~ N(mu, s^2)
    with log-probs averaged over the D dims of x'; None where the adapter has none:
    step_std:    [n, T] s, each action's std (no grad; 0 for deterministic steps). algo.policy_loss=grpo_guard
    mean_drift:  [n, T] ||mu_theta - mu_old||^2 / (2 D s^2), mu_old the rollout's mean, with grad
                 through mu_theta (0 where s == 0). algo.policy_loss=grpo_guard
    step_weight: [n, T] the gradient weight of each action (diffusion: 1 / dt of its denoising step;
                 no grad). algo.step_reweight
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    step_std: torch.Tensor | None = None
    mean_drift: torch.Tensor | None = None
    step_weight: torch.Tensor | None = None


@dataclass(frozen=True)
class ForwardLoss:
    """What `Policy.forward_process_loss` returns for a microbatch of n samples (algo.objective=nft).

    loss:    [n] each sample's DiffusionNFT loss with grad (`mmrl.algorithms.objectives.nft.nft_loss`, averaged
             over its flow times).
    kl:      [n] the distance of the trained model's velocity to the reference model's on the same noised
             inputs, ||v_theta - v_ref||^2 / D (the official code's KL term), with grad; None unless the
             `NFTSpec` asked for it (algo.kl_beta != 0).
    metrics: name -> `mmrl.distributed.reduce.Metric`, e.g. nft_loss's nft/loss_pos, nft/loss_neg, nft/old_deviate.
    """

    loss: torch.Tensor
    kl: torch.Tensor | None = None
    metrics: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Reference:
    """What `Policy.reference_log_probs` returns: the frozen reference model's view of a rollout's
    actions, computed once per step without grad. The core hands each microbatch's slice
    (`select`) back to `Policy.log_probs(rollout, index, reference)`, so the KL term is an explicit
    input of the scoring call and never state hidden inside the adapter.

    log_probs: [n, T] the reference's log-probs of the sampled actions, from which the core estimates
               the KL when `Scores.kl` is None; or None for an adapter that returns an exact `Scores.kl`.
    state:     adapter data, name -> tensor or list with leading dim n, opaque to the core (e.g. the
               reference's SDE-step means [n, T, ...] for the exact Gaussian KL of a diffusion step).
    """

    log_probs: torch.Tensor | None = None
    state: dict = field(default_factory=dict)

    def __len__(self) -> int:
        if self.log_probs is not None:
            return self.log_probs.shape[0]
        return len(next(iter(self.state.values()))) if self.state else 0

    def select(self, idx: torch.Tensor) -> "Reference":
        """The rows `idx` (a 1-D long tensor)."""
        return Reference(log_probs=None if self.log_probs is None else _take(self.log_probs, idx),
                         state={k: _take(v, idx) for k, v in self.state.items()})


class PolicyCannotEvaluate(ConfigError):
    """The policy has no deterministic evaluation: a configuration error (the run must set eval.every=0)."""


@runtime_checkable
class Policy(Protocol):
    """A sampler with a log-likelihood: the members every adapter has, and all the trainer needs to train.

    `model` is the trainable `nn.Module`; the trainer may replace it with the
    `accelerator.prepare`d wrapper, so adapters must call it through `self.model`.

    Randomness: `rollout` (and `Evaluates.generate_eval`) sample prompt i only from `prompts.seeds[i]`, so a
    prompt's samples depend neither on the other prompts of the call nor on how the step's prompts
    are split over processes.

    What only some adapters can do is a capability, a protocol of its own below (`HasReference`, `Evaluates`,
    `Exports`, `ForwardProcess`, `Shardable`, `Interruptible`, `HasExtraState`). An adapter writes the members of
    the ones it serves; it inherits nothing from these classes (they are checked with isinstance, never subclassed), and
    `check_capabilities` refuses a run that needs one its policy lacks, at build, naming the config key.
    """

    model: torch.nn.Module

    def rollout(self, prompts: PromptBatch, group_size: int) -> Rollout: ...

    def log_probs(self, rollout: Rollout, index: torch.Tensor, reference: Reference | None = None) -> Scores: ...

    def trainable_parameters(self) -> Iterable[torch.nn.Parameter]: ...

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...


@runtime_checkable
class HasReference(Protocol):
    """A KL to a frozen reference (needed when algo.kl_beta != 0). The core calls `reference_log_probs(rollout,
    every index)` once per step and passes each microbatch's slice of the result to `log_probs` as `reference`
    (None when kl_beta == 0). `log_probs` returns the same log-probs whether or not a reference is given; the
    reference only adds `Scores.kl` where the adapter has an exact KL. An adapter built with
    `BuildContext.kl_beta == 0` builds no reference model."""

    def reference_log_probs(self, rollout: Rollout, index: torch.Tensor) -> Reference: ...


@runtime_checkable
class Evaluates(Protocol):
    """Held-out evaluation (needed when eval.every > 0): one deterministic output `Sample` per prompt (greedy
    tokens, ODE images), seeded from `prompts.seeds[i]`, scored by the run's rewards as `eval/reward/...`."""

    def generate_eval(self, prompts: PromptBatch) -> list: ...


@runtime_checkable
class Exports(Protocol):
    """`mmrl export`: write the current weights into the existing empty `folder` in the wrapped library's own
    format (`mmrl.state.export`)."""

    def export(self, folder: str) -> None: ...


@runtime_checkable
class ForwardProcess(Protocol):
    """The forward-process loss (needed when algo.objective=nft, DiffusionNFT, `mmrl.algorithms.objectives.nft`).
    The rollout then needs no log-probs (`Rollout.log_probs` may be None, `mask` one column per sample) and is sampled by the "old"
    policy; the core never calls `log_probs` or `reference_log_probs`.
      forward_process_loss(rollout, index, r, spec) -> ForwardLoss: noise each sample's clean output at
          `spec.timesteps` flow times drawn from a generator seeded by the sample's rollout seed and
          `spec.draw` (never the global RNG or the rank), and return `mmrl.algorithms.objectives.nft.nft_loss`
          per sample, r [n] being each sample's optimality probability.
      update_old(decay): old <- decay * old + (1 - decay) * theta, after each training step; the old
          weights belong to the policy's checkpoint (`save` / `load`), so a resumed run is bit-exact.
      old_parameters() -> list of tensors: the old weights, one per `trainable_parameters()` entry in its order
          and shapes: what the rollouts sample with, so what the learner of an asynchronous run publishes to its
          rollout workers (each loads them as its trainable weights and calls `update_old(0.0)`)."""

    def forward_process_loss(self, rollout: Rollout, index: torch.Tensor, r: torch.Tensor, spec) -> ForwardLoss: ...

    def update_old(self, decay: float) -> None: ...

    def old_parameters(self) -> list[torch.Tensor]: ...


@runtime_checkable
class Shardable(Protocol):
    """A policy that keeps references to parameters (distributed.strategy=fsdp, `mmrl.distributed.sharding`): the
    trainer shards `model` in place after `build` (its parameters become DTensors) and then calls `on_shard()`,
    where the policy takes the new ones. Code that reads weights outside `model`'s forward (generation, image
    encoding) runs inside `mmrl.distributed.sharding.gathered(model, mode=BuildContext.rollout)`; every process must
    call each block the same number of times. Models the policy builds besides `model` (a frozen reference) go through
    `BuildContext.shard`."""

    def on_shard(self) -> None: ...


@runtime_checkable
class Interruptible(Protocol):
    """Rollouts that take newer weights between two actions (interruptible rollouts, `asynchronous.interrupt`,
    `mmrl.loop.asynchronous.worker`). After `interrupt_with(check)`, `rollout` calls `check()` between two
    actions (after each sampled token of a reply, before each denoising step); `check` loads the newest weights
    the learner has published when they are newer than the loaded ones and returns the version now loaded. When
    the version changed, the rollout goes on from what it has sampled under the new weights (a reply's prefix is
    computed again with them: no key/value cache of the old weights is reused) and writes, per action, the version
    that produced it in `Rollout.versions`. Its `Rollout.log_probs` are then either each action's log-prob under
    the weights that produced it (a sampler whose log-probs are a by-product of sampling) or None, and the
    worker computes them per version with the training forward. `interrupt_with(None)` removes the check."""

    def interrupt_with(self, check) -> None: ...


@runtime_checkable
class SamplesWithACopy(Protocol):
    """A policy that samples with a copy of its trainable weights held elsewhere (a vLLM engine). An asynchronous
    rollout worker (`mmrl.loop.asynchronous.worker`) overwrites the trainable parameters with a version's tensors and
    then calls `weights_loaded(version)`; the policy brings its copy up to date before it next samples (only when the
    version differs from the one it last sampled with)."""

    def weights_loaded(self, version: int) -> None: ...


@runtime_checkable
class HasExtraState(Protocol):
    """What a sharded checkpoint keeps besides the trainable parameters (`mmrl.state.dcp`): `extra_state()` -> dict of
    tensors, loaded back in place with `load_extra_state(state)` (DiffusionNFT's old weights)."""

    def extra_state(self) -> dict: ...

    def load_extra_state(self, state: dict) -> None: ...


REQUIRED = ("model", "rollout", "log_probs", "trainable_parameters", "save", "load")


def check_policy(policy: object, name: str) -> None:
    """Raise ValueError naming `policy.name` when a built policy lacks a member of the required protocol."""
    missing = [m for m in REQUIRED if not hasattr(policy, m)]
    if missing:
        raise ValueError(f"config key 'policy.name': {name!r} built a {type(policy).__name__} without "
                         f"{', '.join(missing)}; a policy implements mmrl.types.Policy")


def check_capabilities(policy: object, *, kl_beta: float, eval_every: int, objective: str) -> None:
    """ConfigError naming the key whose setting needs a capability this policy lacks (checked once, at build)."""
    kind = type(policy).__name__
    if eval_every > 0 and not isinstance(policy, Evaluates):
        raise PolicyCannotEvaluate(f"config key 'eval.every': policy {kind} has no held-out evaluation "
                                   "(generate_eval); set eval.every=0")
    if objective == "nft" and not isinstance(policy, ForwardProcess):
        raise ConfigError(f"config key 'algo.objective': policy {kind} has no forward-process loss; "
                          "set algo.objective=pg")
    if objective != "nft" and kl_beta != 0 and not isinstance(policy, HasReference):
        raise ConfigError(f"config key 'algo.kl_beta': policy {kind} has no reference model to take a KL to; "
                          "set algo.kl_beta=0")


def _take(value: Any, idx: torch.Tensor) -> Any:
    if isinstance(value, torch.Tensor):
        return value[idx.to(value.device)]
    return [value[i] for i in idx.tolist()]


def select(rollout: Rollout, idx: torch.Tensor) -> Rollout:
    """The samples `idx` (a 1-D long tensor) of `rollout`, state included."""
    return replace(
        rollout,
        samples=[rollout.samples[i] for i in idx.tolist()],
        log_probs=None if rollout.log_probs is None else rollout.log_probs[idx],
        mask=rollout.mask[idx],
        group=rollout.group[idx],
        state={k: _take(v, idx) for k, v in rollout.state.items()},
        engine_log_probs=None if rollout.engine_log_probs is None else rollout.engine_log_probs[idx],
        versions=None if rollout.versions is None else rollout.versions[idx],
    )


def _pad_cat(tensors: list[torch.Tensor], value: float = 0.0) -> torch.Tensor:
    """Concatenate along dim 0, right-padding dim 1 to the longest (for [N, T] tensors)."""
    if tensors[0].dim() < 2 or all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):
        return torch.cat(tensors)
    width = max(t.shape[1] for t in tensors)
    padded = [torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1]), value=value)
              for t in tensors]
    return torch.cat(padded)


def concat(rollouts: list[Rollout]) -> Rollout:
    """Join rollouts of the same adapter; group ids are renumbered to stay distinct."""
    groups, offset = [], 0
    for r in rollouts:
        groups.append(r.group + offset)
        offset += int(r.group.max()) + 1 if len(r) else 0
    state = {}
    for key in rollouts[0].state:
        parts = [r.state[key] for r in rollouts]
        state[key] = _pad_cat(parts) if isinstance(parts[0], torch.Tensor) else sum(parts, [])
    deferred = [r.log_probs is None for r in rollouts]
    if any(deferred) and not all(deferred):
        raise ValueError("cannot concatenate rollouts with and without rollout-time log-probs")
    return Rollout(
        samples=sum((r.samples for r in rollouts), []),
        log_probs=None if deferred[0] else _pad_cat([r.log_probs for r in rollouts]),
        mask=_pad_cat([r.mask for r in rollouts]),
        group=torch.cat(groups),
        state=state,
        engine_log_probs=(None if any(r.engine_log_probs is None for r in rollouts)
                          else _pad_cat([r.engine_log_probs for r in rollouts])),
        versions=(None if any(r.versions is None for r in rollouts)
                  else _pad_cat([r.versions for r in rollouts])),
    )
