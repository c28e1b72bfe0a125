"""Several policies trained together on a multi-role environment (`mmrl.roles`): the generating and learning
roles of a team, with the interfaces of `Generator` and `Learner`, so the trainer's loop runs unchanged.

Each step one round of joint episodes (`JointRounds`: the adapter's team plays every role; each role's
trajectories are samples of the policy that plays it) is scored by the run's rewards; then each policy's
`RoleGenerator` runs the usual filter, best-worst selection, advantages and credit on its own samples (groups of
G per environment seed and role) and its `Learner` updates it with its own optimizer. A resampling filter asks
for more rounds; a round is played once, for every policy, and each policy keeps what its filter keeps.

Asynchronously (`mmrl.loop.asynchronous`) a rollout worker holds the whole team and plays each plan's round
(`JointRounds.sample`, every action stamped with the version of the weights, all policies' weights published
together as one version); the learner's `TeamGenerator.next_batch(step, scored=...)` makes each policy's batch
from it.

Metrics: the team's (`reward/mean` and `env/...` over every role's trajectories) and each policy's under its
name (`listener/reward/mean`, `listener/loss`, ...; the policy section's under `policy/`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mmrl.algorithms.advantages import weighted_total
from mmrl.distributed.reduce import Metric, weighted_mean
from mmrl.episodes import episode_metrics
from mmrl.loop.collect import Generator, draw_prompts


def member_config(cfg, name: str):
    """The run's config as the policy `name` is built and optimized from: the policy section itself (MAIN), or a
    named policy's section and optim overrides in place of the run's."""
    from mmrl.roles import MAIN

    if name == MAIN:
        return cfg
    entry = cfg.policies[name]
    return replace(cfg, policy=entry.policy, optim=entry.optim)


class JointRounds:
    """Rounds of joint episodes, each played once and shared by every policy's generator (kept for one step).

    team:      the adapter's team (`rollout(prompts, G) -> {policy name: Rollout}`, `generate_eval`).
    rewards:   the run's RewardSet; records, sampler, seed, train: as for `Generator`; process_index and
               prompts_per_process: this process's slice of each step's prompts (environment seeds)."""

    def __init__(self, *, team, rewards, records: list, sampler, seed: int, train, process_index: int,
                 prompts_per_process: int):
        self.team, self.rewards, self.records, self.sampler = team, rewards, records, sampler
        self.seed, self.train, self.process_index, self.prompts_per_process = seed, train, process_index, prompts_per_process
        self._rounds: dict = {}

    def sample(self, step: int, rnd: int, version: int | None = None) -> dict:
        """{policy name: Rollout} of round `rnd` of step `step` played now, not scored (not kept); `version`: the
        weights that played it, stamped on every action (an asynchronous rollout worker's)."""
        prompts = draw_prompts(self.sampler, self.records, self.seed, step, rnd, self.train.prompts_per_step,
                               self.prompts_per_process, self.process_index)
        rollouts = self.team.rollout(prompts, self.train.group_size)
        if version is None:
            return rollouts
        return {name: ro if ro.versions is not None else
                replace(ro, versions=torch.full(ro.mask.shape, version, dtype=torch.long))
                for name, ro in rollouts.items()}

    def get(self, step: int, rnd: int) -> dict:
        """{policy name: (rollout, scores [N, K], reward metrics)} of round `rnd` of step `step`."""
        if (step, rnd) not in self._rounds:
            if any(s != step for s, _ in self._rounds):
                self._rounds = {}
            self._rounds[(step, rnd)] = self.scored(self.sample(step, rnd))
        return self._rounds[(step, rnd)]

    def scored(self, rollouts: dict) -> dict:
        """{policy name: (rollout, scores [N, K], reward metrics)} of a round's rollouts, scored by the run's rewards."""
        return {name: (ro, *self.rewards.score(ro.samples)) for name, ro in rollouts.items()}

    def team_metrics(self, step: int, parts: dict | None = None) -> dict[str, Metric]:
        """The team's metrics of the step's first round (`parts`: that round scored elsewhere, an asynchronous
        rollout worker's): the mean reward and the episode metrics over every role's trajectories."""
        parts = (parts if parts is not None else self.get(step, 0)).values()
        samples = [s for ro, _, _ in parts for s in ro.samples]
        total = torch.cat([weighted_total(scores, self.rewards.weights) for _, scores, _ in parts])   # [N_all]
        valid = total[~torch.isnan(total)]
        out = {"reward/mean": weighted_mean(valid.mean() if valid.numel() else float("nan"), valid.numel())}
        out.update(episode_metrics(samples, total, self.train.group_size))
        return out


class RoleGenerator(Generator):
    """The generating role of one policy of a team: its samples of each joint round (`JointRounds`), then the
    usual filter, selection, advantages and credit. `prompts_per_process` counts its groups of one round:
    the process's environment seeds times the roles it plays."""

    def __init__(self, *, name: str, rounds: JointRounds, **kwargs):
        super().__init__(**kwargs)
        self.name, self.rounds = name, rounds

    def _round(self, step: int, rnd: int):
        rollout, scores, metrics = self.rounds.get(step, rnd)[self.name]
        if rollout.versions is None:                                         # one version made every action
            rollout = replace(rollout, versions=torch.full(rollout.mask.shape, self.version, dtype=torch.long))
        return rollout, scores, metrics

    def sample(self, step: int, rnd: int = 0):
        """A team's rounds are played jointly, never by one policy's generator alone: an asynchronous rollout worker
        plays them with `JointRounds.sample` (`mmrl.loop.asynchronous.worker`), not with a generator's `sample`."""
        raise RuntimeError("RoleGenerator.sample: a team's rounds are played by JointRounds.sample")


@dataclass(frozen=True)
class TeamBatch:
    """One step's batches, one per policy, and the step's metrics (the team's and each policy's, prefixed)."""

    batches: dict              # policy name -> StepBatch
    metrics: dict
    version: int = 0


class TeamGenerator:
    """The generating role of a team: `next_batch(step)` -> a `TeamBatch` (module docstring)."""

    def __init__(self, rounds: JointRounds, generators: dict):
        self.rounds, self.generators = rounds, generators

    @property
    def version(self) -> int:
        return next(iter(self.generators.values())).version

    @version.setter
    def version(self, value: int) -> None:
        self.receive(value)

    @property
    def records(self) -> list:
        return self.rounds.records

    @property
    def sampler(self):
        return self.rounds.sampler

    @property
    def rewards(self):
        return self.rounds.rewards

    def receive(self, version: int) -> None:
        for g in self.generators.values():
            g.receive(version)

    def next_batch(self, step: int, scored: dict | None = None) -> TeamBatch:
        """`scored`: the step's round played and scored elsewhere (an asynchronous rollout worker's: policy name ->
        (rollout, scores [N, K], reward metrics)), else played here."""
        batches = {name: g.next_batch(step, scored=None if scored is None else scored[name])
                   for name, g in self.generators.items()}
        metrics = self.rounds.team_metrics(step, scored)
        for name, b in batches.items():
            metrics.update({f"{name}/{k}": v for k, v in b.metrics.items()})
        return TeamBatch(batches, metrics, self.version)

    def state_dict(self) -> dict:
        return {"sampler": self.rounds.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.rounds.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        """Nothing to release."""


class TeamLearner:
    """The learning role of a team: one `Learner` per policy (its own optimizer, scheduler, counters), each
    updated on its policy's batch of the step. `policy`, `optimizer`, `params`, ... are the policy section's."""

    def __init__(self, learners: dict, main: str):
        self.learners, self.main = learners, main

    def __getattr__(self, key):          # policy, optimizer, scheduler, params, ema, accelerator: the main policy's
        if key in ("learners", "main"):
            raise AttributeError(key)
        return getattr(self.learners[self.main], key)

    @property
    def version(self) -> int:            # every policy is updated once per step
        return self.learners[self.main].version

    @version.setter
    def version(self, value: int) -> None:
        for learner in self.learners.values():
            learner.version = value

    def update(self, batch: TeamBatch, step: int) -> dict[str, Metric]:
        out = {}
        for name, learner in self.learners.items():
            out.update({f"{name}/{k}": v for k, v in learner.update(batch.batches[name], step).items()})
        return out

    def published(self) -> list:
        """Every policy's trainable tensors, in the order of `learners` (an asynchronous rollout worker's team loads
        them in the same order: `mmrl.roles.policies_of`)."""
        return [p for learner in self.learners.values() for p in learner.published()]

    def members(self) -> dict:
        """The policies besides the main one, for checkpoints: name -> (policy, optimizer, scheduler)."""
        return {n: (lr.policy, lr.optimizer, lr.scheduler) for n, lr in self.learners.items() if n != self.main}

    def state_dict(self) -> dict:
        return {"counters": self.learners[self.main].counters.state_dict(),
                "policies": {n: lr.state_dict() for n, lr in self.learners.items()}}

    def load_state_dict(self, state: dict) -> None:
        for name, learner in self.learners.items():
            learner.load_state_dict(state["policies"][name])


def step_samples(batch) -> tuple[list, torch.Tensor, torch.Tensor, list]:
    """(samples, scores [N, K], advantages [N], rollouts) of a step batch, a team's concatenated over its policies."""
    parts = list(batch.batches.values()) if isinstance(batch, TeamBatch) else [batch]
    samples = [s for b in parts for s in b.rollout.samples]
    return samples, torch.cat([b.scores for b in parts]), torch.cat([b.advantages for b in parts]), \
        [b.rollout for b in parts]

