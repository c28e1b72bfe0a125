"""`RolloutWorker`: one Ray actor that samples step batches for the asynchronous trainer.

It holds what the synchronous generator holds (the adapter's policy, the reward set, the training records, a
`mmrl.loop.collect.Generator`), built from the run's config in its own process, and a version: the learner's
weights it last loaded. Each call `generate(plan, indices, version, weights, world)` loads newer weights when they
are sent, samples the plan's prompts (their seeds come from (run seed, plan, position), as the synchronous
trainer's come from (run seed, step, position)) and scores them, in `world` shares: the prompts each of the
learner's processes would sample in a synchronous run of that many processes, so that each learner process
filters its share's groups and computes their advantages itself (`Generator.next_batch(plan, scored=...)`).
Every action carries its version in `Rollout.versions`. With a multi-role environment (`mmrl.roles`) the worker
holds every policy of the team and plays each plan's joint round (`mmrl.loop.team.JointRounds.sample`); the
published tensors are all the policies' (`Learner.published`), one version for the team.

With max_staleness > 0 a batch may be trained by newer weights than sampled it, so an adapter's deferred
log-probs (`Rollout.log_probs is None`: the first training forward's own values) would be wrong; the worker then
computes the behaviour log-probs itself, with the same forward and no grad, before returning the batch.

Interruptible rollouts (asynchronous.interrupt): the controller offers each new version to the workers that are
sampling (`offer`, served beside the running `generate` by a second thread of the actor); the policy calls
`check` between two actions (`mmrl.types.Interruptible`), which loads the offered weights there. A batch whose
actions come from several versions and whose log-probs the adapter defers gets them scored per version: each
action's under the weights that produced it (the worker keeps the plan's versions until the batch is returned).
The batch's `version` stays the one its plan started with (its oldest action's).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from dataclasses import replace

import torch

from mmrl.types import SamplesWithACopy


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
    interrupt:    interruptible rollouts (asynchronous.interrupt): the policy calls `check` between actions.
    scores:       build the reward set and score in `generate`; False with reward workers (only `sample`).
    weights:      (asynchronous.weight_sync, the learner's `Publisher.receiver_args()`): how versions arrive.
    """

    def __init__(self, config_yaml: str, index: int, *, cwd: str, behaviour: bool, threads: int,
                 interrupt: bool = False, scores: bool = True, weights: tuple = ("object_store", ())):
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        from mmrl.distributed.weight_sync import WEIGHT_SYNC
        from mmrl.errors import ConfigError
        from mmrl.loop.collect import Generator
        from mmrl.config.policies import adapter
        from mmrl.loop.build import build_policy_for_run, build_rewards, run_records
        from mmrl.loop.team import JointRounds, member_config
        from mmrl.roles import MAIN, policies_of, run_roles

        cfg = load_run_config(config_yaml, cwd, threads)
        self.index, self.behaviour = index, behaviour
        self.timeout_s = cfg.asynchronous.timeout_s
        self.receiver = WEIGHT_SYNC.resolve(weights[0], "asynchronous.weight_sync").receiver(
            *weights[1], worker=index, timeout_s=self.timeout_s)
        self.nft = cfg.algo.objective == "nft"    # DiffusionNFT: no per-action log-probs; samples with its old copy
        self.accelerator = Accelerator(cpu=cfg.cpu or not torch.cuda.is_available(),
                                       mixed_precision={"fp32": "no"}.get(cfg.precision, cfg.precision))
        set_seed(cfg.seed)
        roles = run_roles(cfg)                                         # a multi-role environment: a team
        self.rewards = build_rewards(cfg)[0] if scores else None       # else reward workers score (`sample`)
        records, _ = run_records(cfg)
        self.samples_per_microbatch = cfg.train.samples_per_microbatch
        self.generator = self.rounds = None
        if roles is None:
            self.policy = build_policy_for_run(cfg, self.accelerator, shard=False)
            self.policies = {MAIN: self.policy}
            self.generator = Generator(policy=self.policy, rewards=self.rewards, records=records,
                                       sampler=PlannedPrompts(), seed=cfg.seed, train=cfg.train, algo=cfg.algo,
                                       episodes=cfg.env is not None,
                                       process_index=0, prompts_per_process=cfg.train.prompts_per_step)
        else:        # every policy of the team, in the learner's order; a plan's round is played jointly
            self.policies = {name: build_policy_for_run(member_config(cfg, name), self.accelerator, shard=False)
                             for name in policies_of(roles)}
            self.policy = self.policies[MAIN]
            team = adapter(cfg.policy.name).build_team(self.policies, roles, cfg.env, self.accelerator.device)
            self.rounds = JointRounds(team=team, rewards=self.rewards, records=records, sampler=PlannedPrompts(),
                                      seed=cfg.seed, train=cfg.train, process_index=0,
                                      prompts_per_process=cfg.train.prompts_per_step)
        # the published tensors' order: the learner's (`Learner.published`, a team's policy by policy)
        self.params = [p for policy in self.policies.values() for p in policy.trainable_parameters()]
        self.version = -1                                              # no weights loaded yet
        self.first_call = True
        self._offered = None                # (version, [weights]) the newest the controller offered mid-plan
        self._offers = threading.Lock()     # `offer` runs on the actor's second thread
        self._plan_weights: dict[int, list] = {}   # version -> tensors, of the versions loaded for this plan
        if interrupt:
            from mmrl.types import Interruptible

            if not isinstance(self.policy, Interruptible):
                raise ConfigError(f"config key 'asynchronous.interrupt' is true, but the {cfg.policy.name!r} "
                                  "policy's rollouts cannot be interrupted (it has no interrupt_with)")
            self.policy.interrupt_with(self.check)

    def ready(self) -> dict:
        """Where this worker runs: its index, Ray node id and ip, process id."""
        return placement(self.index)

    def _fetch(self, version: int, handle) -> list:
        """The tensors of a version from its handle (asynchronous.weight_sync; tensors pass as they are)."""
        return self.receiver.fetch(version, handle, self.params)

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
        if self.nft:                      # the published weights are the old (sampling) policy's: old = theta here
            self.policy.update_old(0.0)
        for policy in self.policies.values():
            if isinstance(policy, SamplesWithACopy):    # a vLLM engine: pushed the new version before it samples
                policy.weights_loaded(version)
        self.version = version
        self._plan_weights[version] = weights
        if self.generator is not None:
            self.generator.receive(version)

    def offer(self, version: int, weights: list) -> None:
        """Newer weights for the plan being sampled (`weights[0]`: their handle, or the tensors), loaded at the
        policy's next action boundary (`check`); an offer no newer than what the worker holds is ignored."""
        with self._offers:
            if self._offered is None or version > self._offered[0]:
                self._offered = (version, weights)

    def check(self) -> int:
        """Between two actions of a running rollout: load the offered weights when they are newer; the version
        loaded now."""
        offered = self._offered
        if offered is not None and offered[0] > self.version:
            self._load(offered[0], self._fetch(offered[0], offered[1][0]))
        return self.version

    def generate(self, plan: int, indices: list[int], version: int, weights: list, world: int = 1):
        """Plan `plan` over the records `indices`, sampled by version `version`, whose trainable tensors come from
        the handle `weights[0]` (asynchronous.weight_sync: a Ray object ref, in a list so that Ray does not fetch it,
        or the version to ask the learner for), fetched only when this worker holds another version (e.g. after Ray
        restarted it), and scored; returns
        ([(rollout, scores [N, K], reward metrics)] one per learner process, {"busy_s", "load_s", "restarted"})."""
        t0 = time.perf_counter()
        t1 = self._start(plan, indices, version, weights)
        restarted, self.first_call = self.first_call and _reconstructed(), False
        shares = [self.rounds.scored(ro) if self.rounds is not None else (ro, *self.rewards.score(ro.samples))
                  for ro in self._shares(plan, indices, version, world)]
        return shares, {"busy_s": time.perf_counter() - t0, "load_s": t1 - t0, "restarted": restarted}

    def sample(self, plan: int, indices: list[int], version: int, weights: list, world: int = 1):
        """Plan `plan` sampled as `generate` samples it, not scored (asynchronous.reward_workers: a reward worker
        scores it while this worker samples the next plan). Two returns, so that the samples travel to a reward
        worker without the rest: each share's samples, and (each share's rollout without its samples, info)."""
        if self.rounds is not None:                 # refused when the config is loaded (mmrl.roles)
            raise RuntimeError(f"rollout worker {self.index}: a team's rounds are scored where they are played")
        t0 = time.perf_counter()
        t1 = self._start(plan, indices, version, weights)
        restarted, self.first_call = self.first_call and _reconstructed(), False
        rollouts = self._shares(plan, indices, version, world)
        info = {"busy_s": time.perf_counter() - t0, "load_s": t1 - t0, "restarted": restarted}
        return [ro.samples for ro in rollouts], ([replace(ro, samples=[]) for ro in rollouts], info)

    def _shares(self, plan: int, indices: list[int], version: int, world: int) -> list:
        """The plan's rollout in `world` shares, share r the prompts learner process r trains (the synchronous
        generator's slice for process r of `world`), each with its behaviour log-probs where needed; a team's
        share is {policy name: rollout} of one joint round."""
        if len(indices) % world:
            raise RuntimeError(f"rollout worker {self.index}: plan {plan} has {len(indices)} prompts, not divisible "
                               f"by the {world} learner processes")
        out = []
        for r in range(world):
            if self.rounds is not None:
                self.rounds.process_index, self.rounds.prompts_per_process = r, len(indices) // world
                self.rounds.sampler.indices = list(indices)
                played = self.rounds.sample(plan, 0, version=self.version)
                out.append({name: self._with_behaviour(ro, version, self.policies[name])
                            for name, ro in played.items()})
                continue
            self.generator.process_index, self.generator.prompts_per_process = r, len(indices) // world
            self.generator.sampler.indices = list(indices)
            out.append(self._with_behaviour(self.generator.sample(plan), version, self.policy))
        return out

    def _with_behaviour(self, ro, version: int, policy):
        """The rollout with its behaviour log-probs (by `policy`, which sampled it) where the adapter deferred them
        and they are needed: with max_staleness > 0, or when its actions come from more than the plan's version."""
        mixed = ro.versions is not None and len(ro) and bool((ro.versions[ro.mask.bool().cpu()] != version).any())
        if ro.log_probs is None and len(ro) and (self.behaviour or mixed):
            ro = replace(ro, log_probs=self._behaviour_log_probs(ro, policy))
        return ro

    def _start(self, plan: int, indices: list[int], version: int, weights: list) -> float:
        """Before sampling plan `plan`: the plan's weights loaded, its prompts set; returns the time after."""
        self._plan_weights = {self.version: self._plan_weights[self.version]} if self.version >= 0 else {}
        with self._offers:
            if self._offered is not None and self._offered[0] <= version:
                self._offered = None                                   # older than this plan's weights
        if version != self.version:
            self._load(version, self._fetch(version, weights[0]))
        return time.perf_counter()

    def _behaviour_log_probs(self, rollout, policy) -> torch.Tensor:
        """[N, T] log-probs of the sampled actions, each under the weights that produced it (`Rollout.versions`;
        one pass per version, with the forward training uses); the newest weights are loaded again after."""
        newest = self.version
        versions = None if rollout.versions is None else rollout.versions.cpu()   # [N, T]
        used = sorted(set(versions[rollout.mask.bool().cpu()].tolist())) if versions is not None else []
        if len(used) <= 1 and (not used or used[0] == newest):
            return self._log_probs(rollout, policy)
        out = torch.zeros(rollout.mask.shape)                               # [N, T]
        for v in used:
            self._load(v, self._plan_weights[v])
            out = torch.where(versions == v, self._log_probs(rollout, policy), out)
        self._load(newest, self._plan_weights[newest])
        return out

    def _log_probs(self, rollout, policy) -> torch.Tensor:
        """[N, T] log-probs of the sampled actions under `policy`'s loaded weights (the forward training uses)."""
        with torch.no_grad(), self.accelerator.autocast():
            idx = torch.arange(len(rollout)).split(self.samples_per_microbatch)
            return torch.cat([policy.log_probs(rollout, i).log_probs.float() for i in idx]).cpu()


class RewardWorker:
    """A reward worker (asynchronous.reward_workers > 0; a Ray actor, a plain class in tests): the run's reward set,
    built from its config in its own process, scoring the samples of one plan per call, so that a slow reward (a
    judge, a remote reward server) holds up no rollout worker."""

    def __init__(self, config_yaml: str, index: int, *, cwd: str, threads: int):
        from mmrl.loop.build import build_rewards

        self.index, self.first_call = index, True
        self.rewards, _ = build_rewards(load_run_config(config_yaml, cwd, threads))

    def ready(self) -> dict:
        return placement(self.index, "reward worker")

    def score(self, shares: list):
        """([(scores [N, K], the reward set's metrics)] per share, {"busy_s", "restarted"}) of one plan's samples,
        given as one list per learner process's share."""
        t0 = time.perf_counter()
        restarted, self.first_call = self.first_call and _reconstructed(), False
        scored = [self.rewards.score(samples) for samples in shares]
        return scored, {"busy_s": time.perf_counter() - t0, "restarted": restarted}


_LAUNCH_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                     "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"}


def load_run_config(config_yaml: str, cwd: str, threads: int):
    """In a worker's process: the driver's working directory (relative paths in the config resolve against it,
    and on sys.path, for rewards given as files), torch's CPU threads (Ray sets OMP_NUM_THREADS to the actor's
    CPUs; this is what torch uses), and the run's config loaded and checked again. A worker is one process of its
    own: the variables of a torchrun launch (a learner of several processes), which its Ray processes inherit from
    process 0, are dropped, or the worker's `Accelerator` would join the learner's rendezvous and wait forever."""
    for key in [k for k in os.environ if k in _LAUNCH_VARIABLES or k.startswith("TORCHELASTIC_")]:
        del os.environ[key]
    if os.path.isdir(cwd):
        os.chdir(cwd)
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
    torch.set_num_threads(max(1, threads))
    from mmrl.config import load_config

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config_yaml)
    try:
        return load_config(f.name, saved=True)
    finally:
        os.unlink(f.name)


def placement(index: int, role: str = "rollout worker") -> dict:
    """Where this actor runs: its role and index, Ray node id and ip, process id."""
    import ray

    ctx = ray.get_runtime_context()
    return {"role": role, "worker": index, "node": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
            "pid": os.getpid()}




def _reconstructed() -> bool:
    """Whether Ray rebuilt this actor after it died (Ray's own accessor warns about an API it uses inside)."""
    import warnings

    import ray

    if not ray.is_initialized():                                       # built in process (tests): never rebuilt
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
