"""A learner of several processes (torchrun; DDP or FSDP2): process 0 drives the rollout workers, the others follow.

`mmrl train` launched with torchrun and `asynchronous.enabled=true` runs the learner in every process, as the
synchronous trainer does, and one controller (`mmrl.loop.asynchronous.controller.Controller`) on process 0, the only
one that talks to Ray. Each plan is sampled in `world` shares: share r holds the prompts process r samples in a
synchronous run of `world` processes (the same records, seeds and samples). Each step process 0 picks the plan
the staleness rule keeps and scatters the shares over `torch.distributed` (`share_out`); every process then makes
its own batch from its share (`batch_of`: the group filter and the advantages, whose collectives they join
together), so a run with eta = 0 and one rollout worker trains what the synchronous run of as many processes
trains. Weights are published by process 0: under DDP every process holds the same ones; under FSDP2 each holds
a shard, and every process gathers them, one parameter at a time, at the same two points (`FullWeights`: each new
version's `receive`, and the first `next_batch`, after a resumed run loaded its checkpoint).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from mmrl.distributed.reduce import Metric, maximum, weighted_mean
from mmrl.distributed.sharding import full


class FullWeights:
    """The whole tensors of a sharded learner's published weights (FSDP2 DTensors), gathered on every process, one
    parameter at a time, when the version changed (`update`: a collective, so every process calls it at the same
    points); kept where `keep` (process 0, which publishes them), on the CPU or, with `device="learner"`
    (asynchronous.weight_sync=nccl), on the learner's device."""

    def __init__(self, params: list, keep: bool, device: str = "cpu"):
        self.params, self.keep, self.device = params, keep, device
        self.version, self.tensors = -1, None

    def update(self, version: int) -> None:
        if version == self.version:
            return
        tensors = []
        for p in self.params:                       # one whole parameter at a time; the others only join the gather
            whole = full(p)
            if self.keep:
                tensors.append(whole.detach().to("cpu", copy=True) if self.device == "cpu" else whole.detach().clone())
            del whole
        self.tensors, self.version = (tensors if self.keep else None), version


def _only_here(metrics: dict) -> dict:
    """The controller's metrics as another process reports them: the same means, counts of 0 (they are summed)."""
    return {k: Metric(0, "sum") if m.reduce == "sum" else m for k, m in metrics.items()}


def share_out(plan: int, version: int, shares: list, metrics: dict) -> tuple:
    """On process 0: send share r of the plan (with its version and the controller's metrics) to process r;
    returns this process's share."""
    if len(shares) == 1:
        return shares[0]
    sent = [(plan, version, share, metrics if r == 0 else _only_here(metrics)) for r, share in enumerate(shares)]
    out = [None]
    dist.scatter_object_list(out, sent, src=0)
    return out[0][2]


def batch_of(local, plan: int, version: int, share: tuple, metrics: dict, step: int):
    """A learner process's `StepBatch` of a plan from its share (rollout, scores, reward metrics; a team's
    `TeamBatch` from {policy name: that}): the group filter and the advantages by its own generator (`Generator.next_batch`, whose collectives every process joins), the
    plan's version, the controller's metrics, and the staleness of the actions it trains."""
    batch = local.next_batch(plan, scored=share)
    rollouts = [b.rollout for b in batch.batches.values()] if hasattr(batch, "batches") else [batch.rollout]
    ages, spans, n = [], 0.0, 0                                      # spans: samples whose actions span versions
    for ro in rollouts:                                              # a team's: every policy's
        mask = ro.mask.bool()
        if ro.versions is not None and mask.any():
            ages.append((step - ro.versions)[mask].float())
        if ro.versions is not None and len(ro):
            v, m = ro.versions.cpu(), mask.cpu()
            spans += float((torch.where(m, v, -1).amax(1) > torch.where(m, v, 1 << 62).amin(1)).float().sum())
        n += len(ro)
    age = torch.cat(ages) if ages else torch.zeros(0)
    own = {
        "async/staleness/mean": weighted_mean(float(age.mean()) if age.numel() else 0.0, age.numel()),
        "async/staleness/max": maximum(float(age.max()) if age.numel() else 0.0),
        "async/interrupted_frac": weighted_mean(spans / max(n, 1), n),
    }
    return replace(batch, version=version, metrics={**batch.metrics, **metrics, **own})


class Follower:
    """The generator role of a learner process other than 0: it receives its share of each kept plan from process 0
    and makes its batch (`batch_of`). Same interface as the `Generator` it wraps (`local`)."""

    def __init__(self, local, params: list, sharded: bool):
        self.local, self.sampler, self.rewards, self.records = local, local.sampler, local.rewards, local.records
        self.version = 0
        self.full = FullWeights(params, keep=False) if sharded else None   # FSDP2: this process joins the gathers

    def next_batch(self, step: int):
        if self.full is not None:
            self.full.update(self.version)
        out = [None]
        try:
            dist.scatter_object_list(out, None, src=0)
        except RuntimeError as e:      # a timeout of the process group, or process 0 gone
            raise RuntimeError(f"async: process {dist.get_rank()} received no share of step {step} from process 0 "
                               f"(version {self.version}); process 0 waits up to asynchronous.timeout_s for its "
                               f"rollout workers, see its log: {e}") from e
        plan, version, share, metrics = out[0]
        return batch_of(self.local, plan, version, share, metrics, step)

    def receive(self, version: int) -> None:
        self.version = version
        if self.full is not None:
            self.full.update(version)

    def state_dict(self) -> dict:
        """Process 0 writes the run's state (its controller's); this one has none of its own."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Process 0's controller continues the plans; this process only follows."""

    def close(self) -> None:
        """Nothing to release: process 0 stops the workers."""
