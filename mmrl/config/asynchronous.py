"""The `asynchronous:` config section, its load-time checks and the staleness rules (`on_stale`).

Versions. The learner's weights after k updates are version k; the batch the learner trains at step s is
trained by version s. A rollout records, per action, the version of the weights that produced it
(`Rollout.versions`); an action's staleness is s - its version. `max_staleness` (eta) bounds it:

    eta = 0   every trained action comes from the weights being trained (on-policy; with one rollout
              worker the run trains exactly what the synchronous trainer trains)
    eta = k   no trained action is more than k versions old

How the bound is kept (`on_stale`, the `STALENESS` registry; one `StalenessRule` per entry):

    pace   the controller starts the rollouts of plan p (the p-th step batch) only once the learner has
           reached version p - eta, so plan p, trained at step p, is never too old and no finished sample is
           discarded; generators idle when they are eta versions ahead
    drop   generators start a plan whenever one is free (with the newest weights they have); a finished
           batch older than the bound when the learner reaches it is discarded whole
           (async/dropped_groups) and the learner takes the next

Interruptible rollouts (`interrupt: true`): a worker sampling a plan takes each newer version as soon as the
learner publishes it, at the next action boundary (a token of a reply, a denoising step), and goes on with it, so
a sample's later actions come from newer weights than its first (never older: the bound above, which counts from a
plan's first version, still holds); an agent's episode takes them inside a reply and before each turn's reply.
Each action's behaviour log-prob is the one of the weights that produced it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

from mmrl.errors import ConfigError
from mmrl.registry import Registry


@dataclass(frozen=True)
class AsyncConfig:
    """The `asynchronous` section: rollout workers on Ray beside the learner (mmrl/loop/asynchronous/)."""

    enabled: bool = False                  # false: the synchronous trainer (generate, then update, in one process)
    address: Optional[str] = None          # Ray cluster: null starts one on this machine; auto joins `ray start`'s
    rollout_workers: int = 1               # Ray actors that each hold a policy copy and sample step batches
    cpus_per_worker: float = 1.0           # Ray resources of each rollout worker
    gpus_per_worker: float = 0.0
    reward_workers: int = 0                # Ray actors that score the rollout workers' samples (0: each rollout worker scores its own)
    cpus_per_reward_worker: float = 1.0    # Ray resources of each reward worker
    gpus_per_reward_worker: float = 0.0
    worker_resources: Dict[str, float] = field(default_factory=dict)  # custom Ray resources each worker needs, e.g. {rollout: 1} to place workers on nodes started with `ray start --resources '{"rollout": 4}'`
    max_staleness: int = 0                 # eta: no trained action is more than eta policy versions old
    on_stale: str = "pace"                 # pace (start no plan that would break the bound) | drop (discard stale batches)
    timeout_s: float = 600.0               # longest wait for a rollout worker's batch before the run stops with an error
    interrupt: bool = False                # interruptible rollouts: running samples take newer weights at the next token / denoising step
    weight_sync: str = "object_store"      # how workers get each version: object_store (Ray) | gloo | nccl (a torch.distributed group per worker)
    learner_processes: int = 0             # > 0: the learner runs as this many Ray actors in a placement group (DDP / FSDP2 between them), not in the processes torchrun starts
    cpus_per_learner: float = 1.0          # Ray resources of each learner process (its placement-group bundle)
    gpus_per_learner: float = 0.0
    learner_resources: Dict[str, float] = field(default_factory=dict)  # custom Ray resources each learner process needs, e.g. {learner: 1} to keep the learner on nodes started with `ray start --resources '{"learner": 8}'`
    learner_placement: str = "pack"        # how the learner's bundles are placed: pack | spread | strict_pack | strict_spread (Ray's strategies)
    max_restarts: int = 3                  # a rollout worker that dies (killed, OOM, a crash) is restarted by Ray this many times; its plan is sampled again from its seeds


@dataclass(frozen=True)
class StalenessRule:
    """How the controller keeps the bound eta.

    start(plan, version, eta, queued) -> bool: may plan `plan` start now, with the learner at `version` and
                                            `queued` finished or running plans not yet trained?
    keep(batch_version, step, eta) -> bool:   is a finished batch sampled by `batch_version` trained at
                                            `step` (False: it is discarded)?
    """

    start: Callable[[int, int, int, int], bool]
    keep: Callable[[int, int, int], bool]
    doc: str = ""                            # its line in `--help` and the docs


STALENESS: Registry = Registry("staleness rule")


def _within(batch_version: int, step: int, eta: int) -> bool:
    return step - batch_version <= eta


STALENESS.register("pace")(StalenessRule(
    start=lambda plan, version, eta, queued: plan <= version + eta,
    keep=_within,
    doc="start plan p only once the learner has reached version p - eta: nothing is discarded, generators may wait",
))
# drop: a free generator always starts the next plan (at most one finished batch queued per worker)
STALENESS.register("drop")(StalenessRule(
    start=lambda plan, version, eta, queued: True,
    keep=_within,
    doc="start a plan whenever a worker is free; a batch older than eta when its turn comes is discarded whole",
))


@dataclass(frozen=True)
class Placement:
    """How the learner's placement-group bundles are placed (`learner_placement`): Ray's strategy name."""

    strategy: str
    doc: str                                 # its line in `--help` and the docs


PLACEMENTS: Registry = Registry("placement strategy")
for _name, _strategy, _doc in [
        ("pack", "PACK", "the learner's bundles on as few nodes as fit them (Ray's PACK)"),
        ("spread", "SPREAD", "the bundles on as many nodes as possible (Ray's SPREAD)"),
        ("strict_pack", "STRICT_PACK", "all bundles on one node, or the run stops (Ray's STRICT_PACK)"),
        ("strict_spread", "STRICT_SPREAD", "each bundle on a node of its own, or the run stops (Ray's STRICT_SPREAD)")]:
    PLACEMENTS.register(_name)(Placement(_strategy, _doc))


def check(cfg) -> None:
    """Load-time checks of the `asynchronous` section and of what it cannot combine with yet (ConfigError)."""
    a = cfg.asynchronous
    if not a.enabled:
        return
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("config key 'asynchronous.enabled' is true, but Ray is not installed: "
                          "pip install -e \".[ray]\" (or set asynchronous.enabled=false)")
    for key, low in (("rollout_workers", 1), ("reward_workers", 0), ("max_staleness", 0), ("max_restarts", 0),
                     ("learner_processes", 0)):
        if getattr(a, key) < low:
            raise ConfigError(f"config key 'asynchronous.{key}' must be >= {low}, got {getattr(a, key)}")
    for key in ("cpus_per_worker", "gpus_per_worker", "cpus_per_reward_worker", "gpus_per_reward_worker",
                "cpus_per_learner", "gpus_per_learner"):
        if getattr(a, key) < 0:
            raise ConfigError(f"config key 'asynchronous.{key}' must be >= 0, got {getattr(a, key)}")
    for key in ("worker_resources", "learner_resources"):
        for name, amount in getattr(a, key).items():
            if not isinstance(amount, (int, float)) or amount <= 0:
                raise ConfigError(f"config key 'asynchronous.{key}.{name}' must be a number > 0, got {amount!r}")
    if not a.timeout_s > 0:
        raise ConfigError(f"config key 'asynchronous.timeout_s' must be > 0, got {a.timeout_s}")
    try:
        STALENESS.check(a.on_stale, "asynchronous.on_stale")
        PLACEMENTS.check(a.learner_placement, "asynchronous.learner_placement")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    from mmrl.distributed.weight_sync import WEIGHT_SYNC

    try:
        sync = WEIGHT_SYNC.resolve(a.weight_sync, "asynchronous.weight_sync")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if sync.needs_gpus and (cfg.cpu or a.gpus_per_worker <= 0):
        raise ConfigError(f"config key 'asynchronous.weight_sync' is {a.weight_sync}, which sends CUDA tensors from the "
                          f"learner's GPU to each rollout worker's: it needs cpu=false and asynchronous.gpus_per_worker "
                          f"> 0 (got cpu={cfg.cpu}, gpus_per_worker={a.gpus_per_worker}); use gloo or object_store")
    p = cfg.train.prompts_per_step
    if a.learner_processes and p % a.learner_processes:
        raise ConfigError(f"config key 'asynchronous.learner_processes' is {a.learner_processes}: train.prompts_per_step"
                          f"={p} must be divisible by the learner's processes")
    if a.address not in (None, "auto") and ":" not in str(a.address):
        raise ConfigError(f"config key 'asynchronous.address' must be null (a cluster on this machine), auto "
                          f"(the cluster `ray start` runs here) or host:port, got {a.address!r}")
    _check_combinations(cfg)


def _check_combinations(cfg) -> None:
    """What the asynchronous trainer does not run (yet): each refused with the key to change."""
    from mmrl.algorithms.filtering import RESAMPLING

    algo = cfg.algo
    refused = {
        "algo.filter.name": (algo.filter.name in RESAMPLING, f"{algo.filter.name} (its resampling rounds draw "
                             "prompts in order inside one step; use starpo or none)"),
    }
    if cfg.asynchronous.interrupt:
        refused["policy.backend"] = (getattr(cfg.policy, "backend", "hf") == "vllm", "vllm with "
                                     "asynchronous.interrupt=true (a vLLM generate call does not stop at a token "
                                     "boundary to take new weights; use backend hf, or interrupt=false)")
        refused["algo.objective"] = (algo.objective == "nft", "nft with asynchronous.interrupt=true (a DiffusionNFT "
                                     "sample is trained as one clean image that all its denoising steps made, so "
                                     "it has no one version to bound; set asynchronous.interrupt=false)")
    for key, (bad, why) in refused.items():
        if bad:
            raise ConfigError(f"config key '{key}' is {why}: not supported with asynchronous.enabled=true")
