"""Rollout -> rewards -> group filter -> advantages for one training step.

Each process samples its own slice of the step's prompts (groups never straddle
processes), so group statistics are local; only the dynamic-sampling stop rule and
the final batch size are agreed across processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrl.advantages import combine, weighted_total
from mmrl.data import prompt_seed
from mmrl.dist import all_reduce
from mmrl.credit import token_advantages
from mmrl.episodes import episode_metrics
from mmrl.filtering import FILTERS, best_and_worst
from mmrl.reduce import Metric, mean, summed, weighted_mean
from mmrl.types import PromptBatch, Rollout, concat, select


@dataclass(frozen=True)
class StepBatch:
    rollout: Rollout
    scores: torch.Tensor       # [N, K] raw rewards, NaN = unscorable
    reward: torch.Tensor       # [N] weighted sum of the rewards
    advantages: torch.Tensor   # [N]
    metrics: dict[str, Metric]  # of the first rollout round, each with its reduction
    action_advantages: torch.Tensor | None = None  # [N, T] per-action advantages (turn-level credit), else None


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
                           "to SCORER_METRICS in mmrl/collect.py")
    return out


def _groups(values: torch.Tensor, group_size: int) -> torch.Tensor:
    return values.view(-1, group_size)                                   # [P, G]


def _round(run, step: int, rnd: int) -> tuple[Rollout, torch.Tensor, dict]:
    """Sample one round of prompts on this process and score it."""
    cfg, acc = run.cfg, run.accelerator
    p_total, p_local = cfg.train.prompts_per_step, run.prompts_per_process
    global_idx = run.sampler.take(p_total)                               # same on every process
    lo = acc.process_index * p_local
    mine = global_idx[lo:lo + p_local]
    seeds = [prompt_seed(cfg.seed, step, rnd * p_total + lo + j) for j in range(p_local)]
    prompts = PromptBatch(rows=[run.records[i] for i in mine], index=mine, seeds=seeds, step=step)
    rollout = run.policy.rollout(prompts, cfg.train.group_size)
    if len(rollout) != p_local * cfg.train.group_size:
        raise RuntimeError(f"policy.rollout returned {len(rollout)} samples for {p_local} prompts x "
                           f"group_size {cfg.train.group_size}")
    scores, metrics = run.rewards.score(rollout.samples)                # [N, K]
    return rollout, scores, metrics


def _best_and_worst(rollout: Rollout, scores: torch.Tensor, weights: list, g: int, k: int):
    """Keep the k best and k worst samples of each group; the group size becomes 2k."""
    total = weighted_total(scores, weights)                              # [N]
    cols = best_and_worst(_groups(total, g), k)                          # [P, 2k]
    idx = (cols + torch.arange(cols.shape[0])[:, None] * g).reshape(-1)  # [P * 2k]
    return select(rollout, idx), scores[idx], 2 * k


def collect(run, step: int) -> StepBatch:
    cfg = run.cfg
    g, a = cfg.train.group_size, cfg.algo
    keep_fn = FILTERS.resolve(a.filter.name, "algo.filter.name")
    rounds = 1 + (a.filter.max_resample_rounds if a.filter.name == "dynamic" else 0)
    kept_rollouts, kept_scores, first_metrics, n_kept = [], [], None, 0
    for rnd in range(rounds):
        rollout, scores, metrics = _round(run, step, rnd)
        total = weighted_total(scores, run.rewards.weights)              # [N]
        keep = keep_fn(_groups(total, g), a.filter.keep_frac)            # [P]
        if first_metrics is None:
            first_metrics = declare_reward_metrics(metrics, scores, run.rewards.labels)
            valid = total[~torch.isnan(total)]                            # [M] scorable samples
            reward_mean = valid.mean() if valid.numel() else float("nan")
            first_metrics["reward/mean"] = weighted_mean(reward_mean, valid.numel())
            signal = FILTERS.resolve("dynamic")(_groups(total, g))          # [P] groups with spread
            first_metrics["adv/zero_std_frac"] = mean(1.0 - float(signal.float().mean()))
            if cfg.env is not None:                                       # multi-turn agents
                first_metrics.update(episode_metrics(rollout.samples, total, g))
        idx = torch.nonzero(keep.repeat_interleave(g)).squeeze(1)        # [n_keep * G]
        kept_rollouts.append(select(rollout, idx))
        kept_scores.append(scores[idx])
        n_kept += int(keep.sum())
        if a.filter.name != "dynamic":
            break
        if all_reduce([float(n_kept >= run.prompts_per_process)], "min")[0] > 0:
            break
    # every process trains on the same number of groups (DDP needs equal microbatch counts)
    n_common = int(all_reduce([float(min(n_kept, run.prompts_per_process))], "min")[0])
    rollout = concat(kept_rollouts)
    idx = torch.arange(n_common * g)
    rollout, scores = select(rollout, idx), torch.cat(kept_scores)[idx]
    if a.best_worst_k:
        rollout, scores, g = _best_and_worst(rollout, scores, run.rewards.weights, g, a.best_worst_k)
    adv, reward = combine(scores, run.rewards.weights, group_size=g, estimator=a.advantage,
                          mode=a.reward_combine, eps=a.adv_eps, clip=a.adv_clip)
    first_metrics.update({"filter/kept_groups": mean(n_common), "filter/rounds": mean(rnd + 1),
                          "adv/abs_mean": mean(float(adv.abs().mean()) if adv.numel() else 0.0)})
    per_action = None
    if a.credit.name != "trajectory":                                    # turn-level credit (mmrl.credit)
        per_action = token_advantages(rollout.samples, adv, reward, g, rollout.mask.shape[1], a)   # [N, T]
    return StepBatch(rollout, scores, reward, adv, first_metrics, per_action)
