"""`Controller`: the generating role of an asynchronous run, driving rollout workers on Ray.

The trainer's step loop (`mmrl.loop.trainer.Run.fit`) is the same for both modes: each step it asks its generator
for the step's batch (`next_batch(step)`), the learner updates on it, and the generator receives the new version
(`receive(version)`). Here the generator is a controller:

    plan p        the p-th step batch: its prompts drawn from the run's `PromptSampler` in plan order, its
                  sampling seeds from (run seed, p, position); with no batch discarded, plan p is trained at step p
    next_batch    hands plans to idle workers while the staleness rule allows (`mmrl.config.asynchronous`), then
                  waits for the oldest plan not yet trained; a batch the rule refuses is discarded and the next
                  plan taken. Workers keep sampling while the learner updates: that overlap is the gain. The
                  workers return a plan sampled and scored; the learner's process (each, with several:
                  `mmrl.loop.asynchronous.follower`) filters its groups and computes the advantages (`batch_of`).
    receive       records the learner's new version; its weights are published once (`asynchronous.weight_sync`:
                  Ray's object store, or a torch.distributed group per worker), when a plan is next handed to a
                  worker that holds an older version, or at once with asynchronous.interrupt, when they are offered
                  to every worker that is sampling (it loads them at its next action)

Checkpoints hold the sampler's state before the oldest plan not yet trained (and that plan's number), so a resumed
run samples the unfinished plans again from their seeds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from mmrl.config.asynchronous import STALENESS, AsyncConfig
from mmrl.distributed.reduce import mean, summed
from mmrl.loop.asynchronous.follower import FullWeights, batch_of, share_out

log = logging.getLogger("mmrl")


def _samples(share) -> int:
    """The samples of one learner process's share: (rollout, scores, metrics), or a team's {policy: that}."""
    parts = share.values() if isinstance(share, dict) else [share]
    return sum(len(ro) for ro, _, _ in parts)


@dataclass
class _Running:
    worker: int
    plan: int
    started: float
    version: int = 0                 # the weights the plan was handed out with
    samples: object = None           # with reward workers: the Ray ref of the plan's samples (the worker's 1st return)


@dataclass
class _Sampled:
    """A plan sampled and scored: one (rollout, scores [N, K], reward metrics) per learner process."""

    shares: list
    version: int                     # the weights the plan started with
    info: dict


@dataclass
class _Scoring:
    """A plan whose samples a reward worker scores (asynchronous.reward_workers): the score call is sent when the
    plan starts, on the samples' Ray ref, so Ray runs it as soon as they exist, without the driver; the batch is
    made when both the rollout (the rollout worker's second return) and the scores have arrived."""

    plan: int
    version: int
    samples: object                  # Ray ref of the samples, one list per share (the rollout worker's first return)
    scorer: int                      # the reward worker scoring it
    worker: int                      # the rollout worker sampling it
    rollouts: list | None = None     # each share's rollout without its samples, once its worker returned
    info: dict | None = None
    scored: list | None = None       # [(scores, metrics)] per share, once the reward worker returned


@dataclass
class _Clock:
    """Busy intervals of the workers and the learner's waits, for the idle fractions of each step."""

    window_start: float = field(default_factory=time.perf_counter)
    busy: float = 0.0            # worker-seconds busy inside the current window


class Controller:
    """Plans step batches, hands them to rollout workers under the staleness bound, pushes weights.

    section:      the `asynchronous` config section.
    workers:      Ray actor handles of `mmrl.loop.asynchronous.worker.RolloutWorker`.
    local:        the driver's `mmrl.loop.collect.Generator`: its `PromptSampler` (what the synchronous trainer
                  draws from), its reward set (labels) and records; it samples nothing here.
    params:       the tensors the workers sample with, pushed after each update: the learner's trainable parameters,
                  or DiffusionNFT's old copy of them (algo.objective=nft; a worker loads them as old = theta);
                  `sharded` (FSDP2): DTensors, gathered on every process (`follower.FullWeights`).
    scorers:      Ray actor handles of `RewardWorker` (asynchronous.reward_workers); empty: each rollout worker
                  scores its own samples. With reward workers a rollout worker is free as soon as it has sampled a
                  plan; plan p's samples go straight to reward worker p mod k (a call chained on their Ray ref when
                  the plan starts, so scoring goes on while the learner updates), and the driver makes the batch
                  (group filter, advantages) from the rollout and its scores.
    prompts_per_step, group_size, max_steps: the run's sizes.
    owns_ray:     this run started Ray (`close` shuts it down).
    world:        the learner's processes (torchrun): this controller runs on process 0; each plan is sampled in
                  `world` shares and share r goes to process r (`mmrl.loop.asynchronous.follower`), where that
                  process makes its batch (group filter, advantages) as the synchronous trainer's process r does.
    publisher:    asynchronous.weight_sync's learner side (`mmrl.distributed.weight_sync.Publisher`; default: the
                  object store); `device`: where FSDP2's gathered tensors are kept, "cpu" or "learner" (its GPU, nccl).
    """

    def __init__(self, *, section: AsyncConfig, workers: list, local, params: list, prompts_per_step: int,
                 group_size: int, max_steps: int, owns_ray: bool = False, scorers: list = (), world: int = 1,
                 sharded: bool = False, publisher=None, device: str = "cpu"):
        self.section, self.workers, self.sampler, self.params = section, workers, local.sampler, params
        self.local, self.scorers = local, list(scorers)
        self._scoring: dict = {}               # plan -> _Scoring (reward workers)
        self._score_calls: dict = {}           # Ray ref of a score call -> its plan
        self.rewards, self.records, self.owns_ray = local.rewards, local.records, owns_ray
        self.prompts_per_step, self.group_size, self.max_steps = prompts_per_step, group_size, max_steps
        self.world = world
        self.full = FullWeights(params, keep=True, device=device) if sharded else None   # FSDP2: shards gathered
        if publisher is None:
            from mmrl.distributed.weight_sync import WEIGHT_SYNC

            publisher = WEIGHT_SYNC.resolve("object_store").publisher(section.timeout_s)
        self.publisher = publisher             # asynchronous.weight_sync's learner side
        self.rule = STALENESS.resolve(section.on_stale, "asynchronous.on_stale")
        self.version = 0
        self.next_plan = 0                     # the next plan to hand out
        self.next_train = 0                    # the oldest plan not yet trained (or discarded)
        self.dropped_plans = 0
        self._snapshots: dict[int, dict] = {}  # plan -> sampler state before its prompts were drawn
        self._running: dict = {}               # Ray object ref -> _Running
        self._finished: dict[int, _Sampled] = {}   # plan -> its sampled and scored shares
        self._idle = list(range(len(workers)))
        self.restarts = 0                      # workers Ray restarted (their plans sampled or scored again)
        self._clock = _Clock()
        self._sync_s = 0.0

    # --- the generator interface of Run.fit ---------------------------------------------------------------
    def receive(self, version: int) -> None:
        self.version = version
        if self.full is not None:
            t0 = time.perf_counter()
            self.full.update(version)                 # every process gathers the new version's shards here
            self._sync_s += time.perf_counter() - t0
        if self.section.interrupt and self._running:
            ref = self._weights_handle()
            for running in self._running.values():   # served beside the running plan (the actor's second thread)
                self.workers[running.worker].offer.options(concurrency_group="offers").remote(version, [ref])

    def next_batch(self, step: int):
        """The oldest kept plan's batch of this process (process 0); the other processes' shares are sent to them."""
        t0 = time.perf_counter()
        if self.full is not None:
            self.full.update(self.version)            # the first step's (after a resume: the loaded weights)
        dropped_groups = 0
        while True:
            self._hand_out()
            plan = self.next_train
            if plan not in self._finished:
                self._wait_for(plan)
                continue
            sampled = self._finished.pop(plan)
            self.next_train += 1
            self._snapshots.pop(plan, None)
            if self.rule.keep(sampled.version, step, self.section.max_staleness):
                break
            dropped_groups += sum(map(_samples, sampled.shares)) // max(1, self.group_size)
            self.dropped_plans += 1
            log.info("async: plan %d (version %d) is too old for step %d; discarded", plan, sampled.version, step)
        self._hand_out()                        # the workers sample on while the learner updates
        wait = time.perf_counter() - t0
        metrics = self._metrics(sampled, wait, dropped_groups)
        share = share_out(plan, sampled.version, sampled.shares, metrics)
        return batch_of(self.local, plan, sampled.version, share, metrics, step)

    def state_dict(self) -> dict:
        """The sampler before the oldest plan not yet trained, that plan, and the plans discarded so far (plan
        numbers run ahead of steps by that many)."""
        plan = self.next_train
        sampler = self._snapshots.get(plan, self.sampler.state_dict())
        return {"sampler": dict(sampler), "async_plan": plan, "async_dropped_plans": self.dropped_plans}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's state; one written by the synchronous trainer continues at its step's plan."""
        self.sampler.load_state_dict(state["sampler"])
        self.next_plan = self.next_train = int(state.get("async_plan", state.get("step", 0)))
        self.dropped_plans = int(state.get("async_dropped_plans", 0))

    def close(self) -> None:
        """Stop the workers (and Ray, where this run started it)."""
        import ray

        for w in [*self.workers, *self.scorers]:
            ray.kill(w)
        self.workers, self.scorers = [], []
        self.publisher.close()
        if self.owns_ray:
            ray.shutdown()

    # --- handing out plans ---------------------------------------------------------------------------------
    def _needed(self) -> int:
        """Plans the run can still train: one per remaining step, more for each discarded one."""
        return self.max_steps + self.dropped_plans

    def _hand_out(self) -> None:
        eta, limit = self.section.max_staleness, len(self.workers) + self.section.max_staleness
        while self._idle and self.next_plan < self._needed():
            queued = self.next_plan - self.next_train
            if queued >= limit or not self.rule.start(self.next_plan, self.version, eta, queued):
                return
            self._start(self._idle.pop(0), self.next_plan)
            self.next_plan += 1

    def _start(self, worker: int, plan: int) -> None:
        self._snapshots[plan] = self.sampler.state_dict()
        indices = self.sampler.take(self.prompts_per_step)
        # the ref travels in a list, so the worker fetches the tensors only when it lacks this version
        args = (plan, indices, self.version, [self._weights_handle()], self.world)
        if self.scorers:                       # (samples, (rollout without them, info)): scored elsewhere
            samples, ref = self.workers[worker].sample.options(num_returns=2).remote(*args)
            scorer = plan % len(self.scorers)  # an actor runs its calls in order: the oldest plan's scores first
            self._score_calls[self.scorers[scorer].score.remote(samples)] = plan
            self._scoring[plan] = _Scoring(plan, self.version, samples, scorer, worker)
        else:
            samples, ref = None, self.workers[worker].generate.remote(*args)
        self._running[ref] = _Running(worker, plan, time.perf_counter(), self.version, samples)

    def _weights_handle(self):
        """The current version's handle for a worker's call (its tensors published on first use)."""
        t0 = time.perf_counter()
        self.publisher.keep({r.version for r in self._running.values()} | {self.version, self.version - 1})
        handle = self.publisher.handle(self.version, self._tensors)
        self._sync_s += time.perf_counter() - t0
        return handle

    def _tensors(self) -> list:
        """The current version's tensors as they are now (the publisher copies what it keeps): the parameters, or
        under FSDP2 their gathered whole tensors."""
        return self.full.tensors if self.full is not None else [p.detach() for p in self.params]

    def _wait_for(self, plan: int) -> None:
        """Block until a running plan, or a plan's scoring, finishes (any: workers are freed as they finish)."""
        import ray

        scoring = list(self._score_calls)
        if not self._running and not scoring:
            raise RuntimeError(f"async: plan {plan} is neither running nor finished (version {self.version}, "
                               f"next plan {self.next_plan}); the staleness rule admitted no plan")
        done, _ = ray.wait(list(self._running) + scoring, num_returns=1, timeout=self.section.timeout_s)
        if not done:
            late = ", ".join([f"rollout worker {r.worker} (plan {r.plan})" for r in self._running.values()]
                             + [f"reward worker {self._scoring[p].scorer} (plan {p})"
                                for p in self._score_calls.values()])
            raise RuntimeError(f"async: no worker returned within asynchronous.timeout_s={self.section.timeout_s} "
                               f"s; still running: {late}")
        ref = done[0]
        if ref in self._score_calls:
            self._scored(ref)
            return
        running = self._running.pop(ref)
        try:
            result, info = ray.get(ref)                  # scored shares, or (reward workers) rollouts without samples
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"async: rollout worker {running.worker} died sampling plan {running.plan} after "
                               f"asynchronous.max_restarts={self.section.max_restarts} restarts: {e}") from None
        now = time.perf_counter()
        self._clock.busy += now - max(running.started, self._clock.window_start)
        if info.get("restarted"):
            self.restarts += 1
            log.warning("async: rollout worker %d was restarted; plan %d was sampled again from its seeds",
                        running.worker, running.plan)
        self._idle.append(running.worker)
        self._idle.sort()
        if running.samples is None:
            self._finished[running.plan] = _Sampled(result, running.version, info)
            return
        job = self._scoring[running.plan]                 # sampled, not scored: its reward worker scores it
        job.rollouts, job.info = result, info
        self._make_scored(job)

    def _scored(self, ref) -> None:
        """A reward worker's scores of a plan."""
        import ray

        job = self._scoring[self._score_calls.pop(ref)]
        try:
            scored, info = ray.get(ref)                   # done (ray.wait returned it)
        except ray.exceptions.RayError as e:              # the reward worker died, or the samples it waited for
            raise RuntimeError(f"async: reward worker {job.scorer} could not score plan {job.plan} (sampled by "
                               f"rollout worker {job.worker}; asynchronous.max_restarts={self.section.max_restarts}): "
                               f"{e}") from None
        if info.get("restarted"):
            self.restarts += 1
            log.warning("async: reward worker %d was restarted; plan %d was scored again", job.scorer, job.plan)
        job.scored = scored
        self._make_scored(job)

    def _make_scored(self, job: _Scoring) -> None:
        """Once a plan's rollouts and scores have both arrived: its shares, the samples back in their rollouts."""
        import ray

        if job.rollouts is None or job.scored is None:
            return
        del self._scoring[job.plan]
        try:                                              # the first return of a call whose second one arrived
            samples = ray.get(job.samples, timeout=self.section.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"async: the samples of plan {job.plan} from rollout worker {job.worker} did not "
                               f"arrive within asynchronous.timeout_s={self.section.timeout_s} s") from None
        shares = [(replace(ro, samples=s), scores, metrics)
                  for ro, s, (scores, metrics) in zip(job.rollouts, samples, job.scored)]
        self._finished[job.plan] = _Sampled(shares, job.version, job.info)

    # --- metrics -------------------------------------------------------------------------------------------
    def _metrics(self, sampled: _Sampled, wait: float, dropped_groups: int) -> dict:
        """The controller's metrics of a step (the same on every learner process; counts on process 0 only). The
        staleness of the trained actions is each process's own batch's (`batch_of`)."""
        now = time.perf_counter()
        window = max(now - self._clock.window_start, 1e-9)
        busy = self._clock.busy + sum(now - max(r.started, self._clock.window_start) for r in self._running.values())
        n = len(self.workers)
        out = {
            "async/dropped_groups": summed(dropped_groups),
            "async/learner_idle_frac": mean(min(1.0, wait / window)),
            "async/generator_idle_frac": mean(max(0.0, 1.0 - busy / (n * window))),
            "async/weight_sync_s": mean(self._sync_s + float(sampled.info.get("load_s", 0.0))),
            "async/version": mean(float(sampled.version)),
            "async/worker_restarts": summed(self.restarts),
        }
        self._clock, self._sync_s = _Clock(window_start=now), 0.0
        return out
