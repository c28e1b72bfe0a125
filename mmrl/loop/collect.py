"""The generating role (`Generator`): rollout -> rewards -> group filter -> advantages for one training step.

Each process samples its own slice of the step's prompts (groups never straddle
processes), so group statistics are local; only the dynamic-sampling stop rule and
the final batch size are agreed across processes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mmrl.algorithms.advantages import combine, weighted_total
from mmrl.algorithms.credit import token_advantages
from mmrl.algorithms.filtering import FILTERS, RESAMPLING, best_and_worst, has_signal
from mmrl.data import prompt_seed
from mmrl.distributed.dist import all_reduce
from mmrl.distributed.reduce import Metric, mean, summed, weighted_mean
from mmrl.episodes import episode_metrics
from mmrl.types import PromptBatch, Rollout, concat, select


@dataclass(frozen=True)
class StepBatch:
    rollout: Rollout
    scores: torch.Tensor       # [N, K] raw rewards, NaN = unscorable
    reward: torch.Tensor       # [N] weighted sum of the rewards
    advantages: torch.Tensor   # [N]
    metrics: dict[str, Metric]  # of the first rollout round, each with its reduction
    action_advantages: torch.Tensor | None = None  # [N, T] per-action advantages (turn-level credit), else None
    version: int = 0           # updates the sampling weights had received (the policy version that sampled it)


# The reward scorer (rewards/scorer.py) reports plain numbers, as `rewards` may not import
# the core. Its metrics are `reward/<label>/<suffix>`; this table declares how each suffix
# combines over processes, given the value and the number of samples the reward scored.
SCORER_METRICS = {
    "mean": lambda value, n_scored: weighted_mean(value, n_scored),   # mean over scored samples
    "failed": lambda value, n_scored: summed(value),                  # a count of samples
}
SCORER_TIME = "time/reward/{label}_s"                                  # each reward's wall time: mean over processes


def declare_reward_metrics(metrics: dict, scores: torch.Tensor, labels: list[str]) -> dict[str, Metric]:
    """The scorer's metrics with their reductions; scores [N, K] (NaN = not scored)."""
    n_scored = (~torch.isnan(scores)).sum(0).tolist()                  # [K]
    out = {}
    for label, n in zip(labels, n_scored):
        for suffix, declare in SCORER_METRICS.items():
            key = f"reward/{label}/{suffix}"
            if key in metrics:
                out[key] = declare(metrics[key], n)
        key = SCORER_TIME.format(label=label)
        if key in metrics:
            out[key] = mean(metrics[key])
    unknown = sorted(set(metrics) - set(out))
    if unknown:
        raise RuntimeError(f"reward metrics {unknown} have no declared reduction; add their suffix "
                           "to SCORER_METRICS in mmrl/loop/collect.py")
    return out


def _groups(values: torch.Tensor, group_size: int) -> torch.Tensor:
    return values.view(-1, group_size)                                   # [P, G]


def _best_and_worst(rollout: Rollout, scores: torch.Tensor, weights: list, g: int, k: int):
    """Keep the k best and k worst samples of each group; the group size becomes 2k."""
    total = weighted_total(scores, weights)                              # [N]
    cols = best_and_worst(_groups(total, g), k)                          # [P, 2k]
    idx = (cols + torch.arange(cols.shape[0])[:, None] * g).reshape(-1)  # [P * 2k]
    return select(rollout, idx), scores[idx], 2 * k


def draw_prompts(sampler, records: list, seed: int, step: int, rnd: int, p_total: int, p_local: int,
                 process_index: int) -> PromptBatch:
    """This process's slice of round `rnd` of step `step`: the sampler draws the step's `p_total` prompts (the same on
    every process), each seeded from (seed, step, its position in the round)."""
    global_idx = sampler.take(p_total)                                       # same on every process
    lo = process_index * p_local
    mine = global_idx[lo:lo + p_local]
    seeds = [prompt_seed(seed, step, rnd * p_total + lo + j) for j in range(p_local)]
    return PromptBatch(rows=[records[i] for i in mine], index=mine, seeds=seeds, step=step)


class Generator:
    """The generating role: records (or environment seeds) -> rollout -> rewards -> group filter -> advantages,
    one `StepBatch` per step, stamped with the policy version that sampled it. Built from explicit parts; in the
    synchronous trainer it shares its policy object with the `mmrl.loop.update.Learner`, so `receive` only records
    the version the learner's update produced (a generator in another process would load the weights there).

    policy, rewards:      the adapter's policy (rollout) and the run's RewardSet (score, weights, labels).
    records, sampler:     the training records and the `PromptSampler` that draws each step's prompts.
    seed:                 the run seed (per-prompt sampling seeds derive from it, the step and the position).
    train, algo:          the train and algo config sections (group size, prompts per step; filter,
                          best-worst selection, advantage estimator, reward combination, credit).
    episodes:             whether rollouts are multi-turn episodes (env section): episode metrics are added.
    process_index, prompts_per_process: this process's slice of each step's prompts.
    """

    def __init__(self, *, policy, rewards, records: list, sampler, seed: int, train, algo, episodes: bool,
                 process_index: int, prompts_per_process: int):
        self.policy, self.rewards, self.records, self.sampler = policy, rewards, records, sampler
        self.seed, self.train, self.algo, self.episodes = seed, train, algo, episodes
        self.process_index, self.prompts_per_process = process_index, prompts_per_process
        self.version = 0                                                     # updates applied to the sampling weights

    def receive(self, version: int) -> None:
        """The learner's weights after `version` updates are the ones this generator samples with next."""
        self.version = version

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict()}

    def close(self) -> None:
        """Nothing to release (the asynchronous controller, which stands in for it, stops its workers here)."""

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])

    def _round(self, step: int, rnd: int) -> tuple[Rollout, torch.Tensor, dict]:
        """Sample one round of prompts on this process and score it."""
        rollout = self.sample(step, rnd)
        scores, metrics = self.rewards.score(rollout.samples)               # [N, K]
        return rollout, scores, metrics

    def sample(self, step: int, rnd: int = 0) -> Rollout:
        """One round of this process's prompts, sampled and stamped with versions, not scored (asynchronous
        reward workers score it elsewhere; `next_batch(step, scored=...)` then makes the batch)."""
        g, p_local = self.train.group_size, self.prompts_per_process
        prompts = draw_prompts(self.sampler, self.records, self.seed, step, rnd, self.train.prompts_per_step,
                               p_local, self.process_index)
        rollout = self.policy.rollout(prompts, g)
        if len(rollout) != p_local * g:
            raise RuntimeError(f"policy.rollout returned {len(rollout)} samples for {p_local} prompts x "
                               f"group_size {g}")
        if rollout.versions is None:                                         # one version made every action
            rollout = replace(rollout, versions=torch.full(rollout.mask.shape, self.version, dtype=torch.long))
        return rollout

    def next_batch(self, step: int, scored: tuple | None = None) -> StepBatch:
        """The training batch of `step` (0-based): rounds of rollouts until the filter keeps enough groups.
        `scored`: the first round's (rollout, scores [N, K], reward metrics), sampled and scored elsewhere
        (asynchronous reward workers)."""
        g, a, rewards = self.train.group_size, self.algo, self.rewards
        keep_fn = FILTERS.resolve(a.filter.name, "algo.filter.name")
        resamples = a.filter.name in RESAMPLING
        rounds = 1 + (a.filter.max_resample_rounds if resamples else 0)
        kept_rollouts, kept_scores, first_metrics, n_kept = [], [], None, 0
        for rnd in range(rounds):
            rollout, scores, metrics = scored if scored is not None and rnd == 0 else self._round(step, rnd)
            total = weighted_total(scores, rewards.weights)                  # [N]
            keep = keep_fn(_groups(total, g), a.filter.keep_frac)            # [P]
            if first_metrics is None:
                first_metrics = declare_reward_metrics(metrics, scores, rewards.labels)
                valid = total[~torch.isnan(total)]                            # [M] scorable samples
                reward_mean = valid.mean() if valid.numel() else float("nan")
                first_metrics["reward/mean"] = weighted_mean(reward_mean, valid.numel())
                signal = has_signal(_groups(total, g))                          # [P] groups with spread
                first_metrics["adv/zero_std_frac"] = mean(1.0 - float(signal.float().mean()))
                if self.episodes:                                             # multi-turn agents
                    first_metrics.update(episode_metrics(rollout.samples, total, g))
            idx = torch.nonzero(keep.repeat_interleave(g)).squeeze(1)        # [n_keep * G]
            kept_rollouts.append(select(rollout, idx))
            kept_scores.append(scores[idx])
            n_kept += int(keep.sum())
            if not resamples:
                break
            if all_reduce([float(n_kept >= self.prompts_per_process)], "min")[0] > 0:
                break
        # every process trains on the same number of groups (DDP needs equal microbatch counts)
        n_common = int(all_reduce([float(min(n_kept, self.prompts_per_process))], "min")[0])
        rollout = concat(kept_rollouts)
        idx = torch.arange(n_common * g)
        rollout, scores = select(rollout, idx), torch.cat(kept_scores)[idx]
        if a.best_worst_k:
            rollout, scores, g = _best_and_worst(rollout, scores, rewards.weights, g, a.best_worst_k)
        adv, reward = combine(scores, rewards.weights, group_size=g, estimator=a.advantage,
                              mode=a.reward_combine, eps=a.adv_eps, clip=a.adv_clip)
        first_metrics.update({"filter/kept_groups": mean(n_common), "filter/rounds": mean(rnd + 1),
                              "adv/abs_mean": mean(float(adv.abs().mean()) if adv.numel() else 0.0)})
        per_action = None
        if a.credit.name != "trajectory":                                    # turn-level credit (mmrl.algorithms.credit)
            per_action = token_advantages(rollout.samples, adv, reward, g, rollout.mask.shape[1], a)   # [N, T]
        return StepBatch(rollout, scores, reward, adv, first_metrics, per_action, self.version)
