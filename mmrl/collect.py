"""Rollout -> rewards -> group filter -> advantages for one training step.

Each process samples its own slice of the step's prompts (groups never straddle
processes), so group statistics are local; only the dynamic-sampling stop rule and
the final batch size are agreed across processes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrl.advantages import combine
from mmrl.data import prompt_seed
from mmrl.dist import all_reduce
from mmrl.filtering import FILTERS, best_and_worst
from mmrl.types import PromptBatch, Rollout, concat, select


@dataclass(frozen=True)
class StepBatch:
    rollout: Rollout
    scores: torch.Tensor       # [N, K] raw rewards, NaN = unscorable
    reward: torch.Tensor       # [N] weighted sum of the rewards
    advantages: torch.Tensor   # [N]
    metrics: dict


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


def _best_of_n(rollout: Rollout, scores: torch.Tensor, weights: list, g: int, k: int):
    """Keep the k best and k worst samples of each group; the group size becomes 2k."""
    total = (scores * torch.tensor(weights)).sum(1)                      # [N]
    cols = best_and_worst(_groups(total, g), k)                          # [P, 2k]
    idx = (cols + torch.arange(cols.shape[0])[:, None] * g).reshape(-1)  # [P * 2k]
    return select(rollout, idx), scores[idx], 2 * k


def collect(run, step: int) -> StepBatch:
    cfg = run.cfg
    g, a = cfg.train.group_size, cfg.algo
    keep_fn = FILTERS.get_item(a.filter, "algo.filter")
    rounds = 1 + (a.max_resample_rounds if a.filter == "dynamic" else 0)
    kept_rollouts, kept_scores, first_metrics, n_kept = [], [], None, 0
    for rnd in range(rounds):
        rollout, scores, metrics = _round(run, step, rnd)
        total = (scores * torch.tensor(run.rewards.weights)).sum(1)      # [N]
        keep = keep_fn(_groups(total, g), a.filter_keep_frac)            # [P]
        if first_metrics is None:
            first_metrics = dict(metrics)
            valid = total[~torch.isnan(total)]
            first_metrics["reward/mean"] = float(valid.mean()) if valid.numel() else float("nan")
            first_metrics["adv/zero_std_frac"] = 1.0 - float(FILTERS.get_item("dynamic")(_groups(total, g)).float().mean())
        idx = torch.nonzero(keep.repeat_interleave(g)).squeeze(1)        # [n_keep * G]
        kept_rollouts.append(select(rollout, idx))
        kept_scores.append(scores[idx])
        n_kept += int(keep.sum())
        if a.filter != "dynamic":
            break
        if all_reduce([float(n_kept >= run.prompts_per_process)], "min")[0] > 0:
            break
    # every process trains on the same number of groups (DDP needs equal microbatch counts)
    n_common = int(all_reduce([float(min(n_kept, run.prompts_per_process))], "min")[0])
    rollout = concat(kept_rollouts)
    idx = torch.arange(n_common * g)
    rollout, scores = select(rollout, idx), torch.cat(kept_scores)[idx]
    if a.best_of_n:
        rollout, scores, g = _best_of_n(rollout, scores, run.rewards.weights, g, a.best_of_n)
    adv, reward = combine(scores, run.rewards.weights, group_size=g, estimator=a.advantage,
                          mode=a.reward_combine, eps=a.adv_eps, clip=a.adv_clip)
    first_metrics.update({"filter/kept_groups": n_common, "filter/rounds": rnd + 1,
                          "adv/abs_mean": float(adv.abs().mean()) if adv.numel() else 0.0})
    return StepBatch(rollout, scores, reward, adv, first_metrics)
