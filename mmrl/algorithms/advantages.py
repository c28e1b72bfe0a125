"""Group advantage estimators: rewards [P, G] -> advantages [P, G].

Notation (as in GRPO's outcome-supervised advantages, arXiv 2402.03300 section 4.1.2): P prompts,
G samples per prompt (one group), r the rewards [P, G].
NaN in `r` marks an unscorable sample: it is left out of its group's statistics and its
advantage is 0. A group whose valid rewards are all equal (or with fewer than two valid
rewards) carries no signal and gets 0 everywhere.

Std convention: torch's unbiased std (Bessel-corrected, as TRL and DanceGRPO), with `eps`
added to the denominator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrl.registry import Registry

ESTIMATORS: Registry = Registry("advantage estimator")


@dataclass(frozen=True)
class GroupStats:
    """Masked statistics of each group's valid (non-NaN) rewards, all [P, 1] but `valid` [P, G]."""

    valid: torch.Tensor       # [P, G] bool, r is not NaN
    n: torch.Tensor           # [P, 1] number of valid rewards
    mean: torch.Tensor        # [P, 1] mean of the valid rewards (0 for none)
    std: torch.Tensor         # [P, 1] unbiased std of the valid rewards (0 with fewer than two)
    has_signal: torch.Tensor  # [P, 1] bool, two or more valid rewards that are not all equal


def group_stats(r: torch.Tensor) -> GroupStats:
    """Masked per-group statistics of r [P, G] (NaN = unscorable), shared by the estimators
    here and the group filters (`mmrl.algorithms.filtering`)."""
    valid = ~torch.isnan(r)                                      # [P, G]
    x = torch.where(valid, r, 0.0)                               # [P, G]
    n = valid.sum(dim=1, keepdim=True)                           # [P, 1]
    mean = x.sum(dim=1, keepdim=True) / n.clamp(min=1)           # [P, 1]
    sq = torch.where(valid, (r - mean) ** 2, 0.0)                # [P, G]
    var = sq.sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)     # [P, 1] unbiased
    std = torch.where(n >= 2, var.sqrt(), 0.0)                   # [P, 1]
    hi = torch.where(valid, r, -torch.inf).amax(dim=1, keepdim=True)   # [P, 1]
    lo = torch.where(valid, r, torch.inf).amin(dim=1, keepdim=True)    # [P, 1]
    return GroupStats(valid, n, mean, std, (n >= 2) & (hi > lo))


def _finish(a: torch.Tensor, g: GroupStats) -> torch.Tensor:
    return torch.where(g.valid & g.has_signal, a, 0.0)            # [P, G]


@ESTIMATORS.register("grpo")
def grpo(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """GRPO (arXiv 2402.03300): A = (r - mean_g r) / (std_g r + eps)."""
    g = group_stats(r.float())
    return _finish((r - g.mean) / (g.std + eps), g)               # [P, G]


@ESTIMATORS.register("dr_grpo")
def dr_grpo(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Dr.GRPO (arXiv 2503.20783): A = r - mean_g r (no std division)."""
    g = group_stats(r.float())
    return _finish(r - g.mean, g)                                 # [P, G]


@ESTIMATORS.register("rloo")
def rloo(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """RLOO (arXiv 2402.14740): A_i = r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean)."""
    g = group_stats(r.float())
    return _finish(g.n / (g.n - 1).clamp(min=1) * (r - g.mean), g)  # [P, G]


def _batch_whiten(x: torch.Tensor, valid: torch.Tensor, eps: float) -> torch.Tensor:
    """(x - mean) / (std + eps) over every valid entry of the batch (unbiased std)."""
    vals = x[valid]                                               # [M]
    if vals.numel() < 2:
        return torch.zeros_like(x)
    return (x - vals.mean()) / (vals.std() + eps)                 # [P, G]


@ESTIMATORS.register("reinforce_pp")
def reinforce_pp(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with group baseline (arXiv 2501.03262; veRL's
    `reinforce_plus_plus_baseline`): subtract the group mean, then whiten over the batch.
    Batch statistics are over this process's batch, and over the samples of groups with
    signal only (veRL also counts the zeros of zero-spread groups, which shrinks the std)."""
    g = group_stats(r.float())
    keep = g.valid & g.has_signal                                 # [P, G]
    centred = torch.where(keep, r - g.mean, 0.0)                  # [P, G]
    return torch.where(keep, _batch_whiten(centred, keep, eps), 0.0)


@ESTIMATORS.register("grpo_batch_std")
def grpo_batch_std(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Flow-GRPO (arXiv 2505.05470): group mean, std over the whole batch. Pair with
    `algo.adv_clip: 5.0` for its [-5, 5] clipping. The std is the population std, as Flow-GRPO's
    `np.std` (no Bessel correction); Flow-GRPO adds 1e-4 to it where this adds `eps`."""
    g = group_stats(r.float())
    keep = g.valid & g.has_signal                                 # [P, G]
    vals = r.float()[g.valid]                                     # [M]
    std = vals.std(correction=0) if vals.numel() >= 2 else torch.tensor(0.0)
    return torch.where(keep, (r - g.mean) / (std + eps), 0.0)     # [P, G]


def weighted_total(scores: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """The weighted reward sum per sample: scores [N, K] -> [N]; NaN where any of the
    sample's rewards is NaN (unscorable by one reward means unscorable in total)."""
    if scores.shape[1] != len(weights):
        raise ValueError(f"{scores.shape[1]} reward columns but {len(weights)} weights")
    return (scores.float() * torch.tensor(weights, dtype=torch.float32)).sum(dim=1)  # [N]


REWARD_COMBINES: Registry = Registry("reward combination")


@REWARD_COMBINES.register("reward_sum")
def reward_sum(scores: torch.Tensor, w: torch.Tensor, group_size: int, estimator, eps: float) -> torch.Tensor:
    """Weighted sum of the raw rewards, then one advantage; a sample with any NaN reward is unscorable.
    scores [N, K], w [K] -> [N]."""
    total = (scores.float() * w).sum(dim=1)                                      # [N] NaN if any NaN
    return estimator(total.view(-1, group_size), eps=eps).reshape(-1)            # [N]


@REWARD_COMBINES.register("advantage_sum")
def advantage_sum(scores: torch.Tensor, w: torch.Tensor, group_size: int, estimator, eps: float) -> torch.Tensor:
    """One advantage per reward, then their weighted sum (DanceGRPO / MixGRPO); a NaN reward only zeroes its own
    term. scores [N, K], w [K] -> [N]."""
    per = [estimator(scores[:, j].float().view(-1, group_size), eps=eps).reshape(-1) for j in range(scores.shape[1])]
    return (torch.stack(per, dim=1) * w).sum(dim=1)                              # [N]


def combine(scores: torch.Tensor, weights: list[float], *, group_size: int, estimator: str,
            mode: str, eps: float = 1e-6, clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Several rewards -> one advantage per sample.

    scores:  [N, K] raw rewards (NaN = unscorable), N = P * G ordered by group.
    mode:    "reward_sum"     weighted sum of raw rewards, then one advantage (a sample with
                              any NaN reward is unscorable);
             "advantage_sum"  one advantage per reward, then their weighted sum
                              (DanceGRPO / MixGRPO); a NaN reward only zeroes its own term.
    Returns (advantages [N], combined reward [N]).
    """
    fn = ESTIMATORS.resolve(estimator, "algo.advantage")
    n, k = scores.shape
    if len(weights) != k:
        raise ValueError(f"{k} reward columns but {len(weights)} weights")
    if n % group_size:
        raise ValueError(f"{n} samples do not split into groups of {group_size}")
    w = torch.tensor(weights, dtype=torch.float32)                # [K]
    total = weighted_total(scores, weights)                       # [N] NaN if any NaN
    adv = REWARD_COMBINES.resolve(mode, "algo.reward_combine")(scores, w, group_size, fn, eps)   # [N]
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return adv, total
