"""PPO's clipped surrogate (arXiv 1707.06347 eq. 7) as GRPO uses it (arXiv 2402.03300 eq. 3), with DAPO's
clip-higher (eps_low != eps_high, arXiv 2503.14476): `algo.policy_loss: ppo_clip` (the default).

`clipped_surrogate` is the math the clipped entries share: dual_clip.py adds Ye et al.'s bound for negative
advantages, gspo.py takes the ratio per sequence, grpo_guard.py normalises it first (RatioNorm).

Notation: logp = log pi_theta, old = log pi_old, A the advantage, r = exp(logp - old) the ratio, eps_low /
eps_high the clip range (algo.clip_low / clip_high), c the dual-clip constant (algo.dual_clip).
All tensors are [n, T] with `mask` [n, T] unless noted; math runs in fp32.
"""

from __future__ import annotations

import torch

from mmrl.algorithms.guard import ratio_norm
from mmrl.algorithms.policy_losses import SurrogateInput, no_dual_clip, register
from mmrl.distributed.reduce import maximum, weighted_mean


def sequence_log_ratio(log_r: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence ratio (arXiv 2507.18071 eq. 6): log s = mean_t log r over the sample's actions, shared by
    them. [n, T] -> [n, T]."""
    seq = (log_r * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)   # [n, 1]
    return seq.expand_as(log_r)                                                          # [n, T]


LEVELS = ("token", "sequence")


def clipped_surrogate(logp, old, adv, mask, *, clip_low: float, clip_high: float,
                      dual_clip: float | None = None, level: str = "token", norm: tuple | None = None):
    """Per-action PPO/GRPO loss l = -min(r A, clip(r, 1-eps_low, 1+eps_high) A).

    adv: [n] one advantage per sample, or [n, T] one per action (turn-level credit, `mmrl.algorithms.credit`).
    level "token": r per action; "sequence" (GSPO,
    arXiv 2507.18071): s = exp(mean_t(logp - old)) over the mask, shared by the sequence.
    dual_clip c: for A < 0, l = min(l, -c A).
    norm (std, drift), each [n, T]: GRPO-Guard's RatioNorm (`mmrl.algorithms.guard`), log r -> std * (log r + drift)
    before anything else. Returns (l [n, T], metrics declared per token).
    """
    mask = mask.float()
    log_r = logp.float() - old.float()                              # [n, T]
    raw_log_r = log_r
    if norm is not None:
        log_r = ratio_norm(log_r, *norm)                            # [n, T]
    if level not in LEVELS:
        raise ValueError(f"ratio level {level!r} is not one of {', '.join(LEVELS)}")
    if level == "sequence":
        log_r = sequence_log_ratio(log_r, mask)                     # [n, T]
    r = torch.exp(log_r)                                            # [n, T]
    a = adv.float()[:, None].expand_as(r) if adv.dim() == 1 else adv.float()   # [n, T]
    unclipped = -r * a
    clipped = -r.clamp(1 - clip_low, 1 + clip_high) * a
    l = torch.maximum(unclipped, clipped)                           # [n, T]
    dual = torch.zeros_like(l, dtype=torch.bool)
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"algo.dual_clip must be > 1 (typically 3), got {dual_clip}")
        bound = -dual_clip * a
        dual = (a < 0) & (l > bound)
        l = torch.where(a < 0, torch.minimum(l, bound), l)
    m = mask.bool()
    low = (r < 1 - clip_low) & (a < 0)
    high = (r > 1 + clip_high) & (a > 0)
    n_tok = mask.sum()
    count = n_tok.clamp(min=1)

    def per_token(x):                                               # a mean over this batch's actions
        return weighted_mean(x, n_tok)

    with torch.no_grad():
        metrics = {
            "clip_frac": per_token(((low | high) & m).sum() / count),
            "clip_frac/low": per_token((low & m).sum() / count),
            "clip_frac/high": per_token((high & m).sum() / count),
            "clip_frac/dual": per_token((dual & m).sum() / count),
            "approx_kl": per_token((((r - 1) - log_r) * mask).sum() / count),   # k3(old || new)
            "ratio/mean": per_token((r * mask).sum() / count),
            "ratio/max_abs_dev": maximum(((r - 1).abs() * mask).max()),
        }
        if norm is not None:                                        # the paper's diagnostics: raw ratio, drift
            metrics["ratio/raw_mean"] = per_token((torch.exp(raw_log_r) * mask).sum() / count)
            metrics["ratio_norm/drift"] = per_token((norm[1].detach().float() * mask).sum() / count)
    return l, metrics


def check(algo) -> None:
    no_dual_clip(algo, "ppo_clip")


@register("ppo_clip", check=check)
def ppo_clip(inp: SurrogateInput, spec):
    """l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) per action, r per token."""
    return clipped_surrogate(inp.logp, inp.old, inp.adv, inp.mask, clip_low=spec.clip_low, clip_high=spec.clip_high)
