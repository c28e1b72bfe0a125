"""The types every adapter and the core share: `Rollout`, `Scores`, `PromptBatch`, `Policy`.

Layout convention: a rollout holds N = P * G samples ordered by group, sample i belonging
to prompt i // G; `group` records that index explicitly. T is the number of actions
(tokens for a VLM, trained denoising steps for diffusion).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Protocol, runtime_checkable

import torch


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
    """

    samples: list
    log_probs: torch.Tensor | None
    mask: torch.Tensor
    group: torch.Tensor
    state: dict = field(default_factory=dict)

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
    kl:        [n, T] exact per-action KL to the reference computed by the adapter (e.g. the
               Gaussian KL of two SDE steps), or None to let the core estimate it from
               `reference_log_probs`.
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    kl: torch.Tensor | None = None


@runtime_checkable
class Policy(Protocol):
    """A sampler with a log-likelihood: what the trainer drives (DESIGN.md).

    `model` is the trainable `nn.Module`; the trainer may replace it with the
    `accelerator.prepare`d wrapper, so adapters must call it through `self.model`.
    """

    model: torch.nn.Module

    def rollout(self, prompts: PromptBatch, group_size: int) -> Rollout: ...

    def log_probs(self, rollout: Rollout, index: torch.Tensor) -> Scores: ...

    def reference_log_probs(self, rollout: Rollout, index: torch.Tensor) -> torch.Tensor | None: ...

    def trainable_parameters(self) -> Iterable[torch.nn.Parameter]: ...

    def save(self, path: str) -> None: ...

    def load(self, path: str) -> None: ...


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
    )
