"""`RolloutWorker`: one Ray actor that samples step batches for the asynchronous trainer.

It holds what the synchronous generator holds (the adapter's policy, the reward set, the training records, a
`mmrl.loop.collect.Generator`), built from the run's config in its own process, and a version: the learner's
weights it last loaded. Each call `generate(plan, indices, version, weights)` loads newer weights when they are
sent, samples the plan's prompts (their seeds come from (run seed, plan, position), as the synchronous trainer's
come from (run seed, step, position)), scores them, filters the groups and computes advantages, and returns the
`StepBatch` stamped with its version and, per action, `Rollout.versions`.

With max_staleness > 0 a batch may be trained by newer weights than sampled it, so an adapter's deferred
log-probs (`Rollout.log_probs is None`: the first training forward's own values) would be wrong; the worker then
computes the behaviour log-probs itself, with the same forward and no grad, before returning the batch.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import replace

import torch


class PlannedPrompts:
    """The sampler of a worker's generator: the controller decides each plan's prompt indices (from the run's
    `PromptSampler`), the worker's generator takes exactly those."""

    def __init__(self) -> None:
        self.indices: list[int] = []

    def take(self, k: int) -> list[int]:
        if k != len(self.indices):
            raise RuntimeError(f"the generator asked for {k} prompts, the controller planned {len(self.indices)}")
        out, self.indices = self.indices, []
        return out


class RolloutWorker:
    """A rollout worker (instantiated by Ray as an actor; a plain class, so tests can build one in process).

    config_yaml:  the run's resolved config (`mmrl.config.to_yaml`), loaded and checked again here.
    cwd:          the driver's working directory (relative paths in the config resolve against it).
    behaviour:    compute deferred behaviour log-probs (max_staleness > 0).
    threads:      torch CPU threads (Ray sets OMP_NUM_THREADS to the actor's CPUs; this is what torch uses).
    """

    def __init__(self, config_yaml: str, index: int, *, cwd: str, behaviour: bool, threads: int):
        if os.path.isdir(cwd):
            os.chdir(cwd)
            if cwd not in sys.path:
                sys.path.insert(0, cwd)
        torch.set_num_threads(max(1, threads))
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        from mmrl.config import load_config
        from mmrl.loop.collect import Generator
        from mmrl.loop.build import build_policy_for_run, build_rewards, run_records

        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(config_yaml)
        try:
            cfg = load_config(f.name, saved=True)
        finally:
            os.unlink(f.name)
        self.index, self.behaviour = index, behaviour
        self.accelerator = Accelerator(cpu=cfg.cpu or not torch.cuda.is_available(),
                                       mixed_precision={"fp32": "no"}.get(cfg.precision, cfg.precision))
        set_seed(cfg.seed)
        self.policy = build_policy_for_run(cfg, self.accelerator, shard=False)
        self.params = list(self.policy.trainable_parameters())
        rewards, _ = build_rewards(cfg)
        records, _ = run_records(cfg)
        self.samples_per_microbatch = cfg.train.samples_per_microbatch
        self.generator = Generator(policy=self.policy, rewards=rewards, records=records, sampler=PlannedPrompts(),
                                   seed=cfg.seed, train=cfg.train, algo=cfg.algo, episodes=cfg.env is not None,
                                   process_index=0, prompts_per_process=cfg.train.prompts_per_step)
        self.version = -1                                              # no weights loaded yet
        self.first_call = True

    def ready(self) -> dict:
        """Where this worker runs: its index, Ray node id and ip, process id."""
        import ray

        ctx = ray.get_runtime_context()
        return {"worker": self.index, "node": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def _load(self, version: int, weights: list) -> None:
        if len(weights) != len(self.params):
            raise RuntimeError(f"rollout worker {self.index}: version {version} has {len(weights)} trainable "
                               f"tensors, this worker's policy {len(self.params)}")
        with torch.no_grad():
            for i, (p, w) in enumerate(zip(self.params, weights)):
                if p.shape != w.shape:
                    raise RuntimeError(f"rollout worker {self.index}: version {version}, trainable tensor {i} "
                                       f"has shape {tuple(w.shape)}, this worker's {tuple(p.shape)}")
                p.copy_(w)
        self.version = version
        self.generator.receive(version)

    def generate(self, plan: int, indices: list[int], version: int, weights: list):
        """The `StepBatch` of plan `plan` over the records `indices`, sampled by version `version`, whose
        trainable tensors are the object `weights[0]` (a Ray object ref, in a list so that Ray does not fetch it:
        it is fetched only when this worker holds another version, e.g. after Ray restarted it); returns
        (batch, {"busy_s", "load_s", "restarted"})."""
        import ray

        t0 = time.perf_counter()
        if version != self.version:
            self._load(version, ray.get(weights[0]))
        t1 = time.perf_counter()
        restarted, self.first_call = self.first_call and _reconstructed(), False
        self.generator.sampler.indices = list(indices)
        batch = self.generator.next_batch(plan)
        if self.behaviour and batch.rollout.log_probs is None and len(batch.rollout):
            batch = replace(batch, rollout=replace(batch.rollout, log_probs=self._behaviour_log_probs(batch.rollout)))
        return batch, {"busy_s": time.perf_counter() - t0, "load_s": t1 - t0, "restarted": restarted}

    def _behaviour_log_probs(self, rollout) -> torch.Tensor:
        """[N, T] log-probs of the sampled actions under this worker's weights (the forward training uses)."""
        with torch.no_grad(), self.accelerator.autocast():
            idx = torch.arange(len(rollout)).split(self.samples_per_microbatch)
            return torch.cat([self.policy.log_probs(rollout, i).log_probs.float() for i in idx]).cpu()


def _reconstructed() -> bool:
    """Whether Ray rebuilt this actor after it died (Ray's own accessor warns about an API it uses inside)."""
    import warnings

    import ray

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
