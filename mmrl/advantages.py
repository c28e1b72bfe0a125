"""Group advantage estimators: rewards [P, G] -> advantages [P, G].

Notation (REFERENCE.md section 1): P prompts, G samples per prompt, r the rewards.
NaN in `r` marks an unscorable sample: it is left out of its group's statistics and its
advantage is 0. A group whose valid rewards are all equal (or with fewer than two valid
rewards) carries no signal and gets 0 everywhere.

Std convention: torch's unbiased std (Bessel-corrected, as TRL and DanceGRPO), with `eps`
added to the denominator.
"""

from __future__ import annotations

import torch

from mmrl.registry import Registry

ESTIMATORS: Registry = Registry("advantage estimator")


def _group_stats(r: torch.Tensor):
    """Masked per-group statistics of r [P, G] -> (valid, n, mean, std, has_signal)."""
    valid = ~torch.isnan(r)                                      # [P, G]
    x = torch.where(valid, r, 0.0)                               # [P, G]
    n = valid.sum(dim=1, keepdim=True)                           # [P, 1]
    mean = x.sum(dim=1, keepdim=True) / n.clamp(min=1)           # [P, 1]
    sq = torch.where(valid, (r - mean) ** 2, 0.0)                # [P, G]
    std = (sq.sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()  # [P, 1] unbiased
    hi = torch.where(valid, r, -torch.inf).amax(dim=1, keepdim=True)
    lo = torch.where(valid, r, torch.inf).amin(dim=1, keepdim=True)
    has_signal = (n >= 2) & (hi > lo)                            # [P, 1]
    return valid, n, mean, std, has_signal


def _finish(a: torch.Tensor, valid: torch.Tensor, has_signal: torch.Tensor) -> torch.Tensor:
    return torch.where(valid & has_signal, a, 0.0)


@ESTIMATORS.register("grpo")
def grpo(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """GRPO (arXiv 2402.03300): A = (r - mean_g r) / (std_g r + eps)."""
    valid, _, mean, std, sig = _group_stats(r.float())
    return _finish((r - mean) / (std + eps), valid, sig)          # [P, G]


@ESTIMATORS.register("dr_grpo")
def dr_grpo(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Dr.GRPO (arXiv 2503.20783): A = r - mean_g r (no std division)."""
    valid, _, mean, _, sig = _group_stats(r.float())
    return _finish(r - mean, valid, sig)                          # [P, G]


@ESTIMATORS.register("rloo")
def rloo(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """RLOO (arXiv 2402.14740): A_i = r_i - mean_{j != i} r_j = n/(n-1) (r_i - mean)."""
    valid, n, mean, _, sig = _group_stats(r.float())
    return _finish(n / (n - 1).clamp(min=1) * (r - mean), valid, sig)  # [P, G]


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
    valid, _, mean, _, sig = _group_stats(r.float())
    centred = torch.where(valid & sig, r - mean, 0.0)             # [P, G]
    keep = valid & sig
    return torch.where(keep, _batch_whiten(centred, keep, eps), 0.0)


@ESTIMATORS.register("grpo_batch_std")
def grpo_batch_std(r: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Flow-GRPO (arXiv 2505.05470): group mean, std over the whole batch. Pair with
    `algo.adv_clip: 5.0` for its [-5, 5] clipping."""
    valid, _, mean, _, sig = _group_stats(r.float())
    keep = valid & sig
    vals = r.float()[valid]
    std = vals.std() if vals.numel() >= 2 else torch.tensor(0.0)
    return torch.where(keep, (r - mean) / (std + eps), 0.0)       # [P, G]


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
    fn = ESTIMATORS.get_item(estimator, "algo.advantage")
    n, k = scores.shape
    if len(weights) != k:
        raise ValueError(f"{k} reward columns but {len(weights)} weights")
    if n % group_size:
        raise ValueError(f"{n} samples do not split into groups of {group_size}")
    w = torch.tensor(weights, dtype=torch.float32)                # [K]
    total = (scores.float() * w).sum(dim=1)                       # [N] NaN if any NaN
    if mode == "reward_sum":
        adv = fn(total.view(-1, group_size), eps=eps).reshape(-1)   # [N]
    elif mode == "advantage_sum":
        per = [fn(scores[:, j].float().view(-1, group_size), eps=eps).reshape(-1) for j in range(k)]
        adv = (torch.stack(per, dim=1) * w).sum(dim=1)            # [N]
    else:
        raise ValueError(f"unknown algo.reward_combine {mode!r}; valid: reward_sum, advantage_sum")
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return adv, total
