"""CISPO, clipped importance-sampling-weight policy optimization (MiniMax-M1, arXiv 2506.13585 eq. 4-5):
`algo.policy_loss: cispo`.

    J(theta) = E[ sum_t sg(r_hat_t) A_t log pi_theta(a_t) ],   r_hat = clip(r, 1 - eps_low^IS, 1 + eps_high^IS)

Unlike PPO's clip, no action's gradient is dropped: the clipped, detached weight only scales each token's
policy-gradient term, so rare tokens ("However", "Wait") keep contributing after the first update. The paper
sets no lower bound (eps_low^IS large) and tunes eps_high^IS; here they are algo.clip_low and algo.clip_high
(a clip_low near 1, say 0.99, all but removes the lower bound).
On-policy (r = 1) the gradient equals PPO-clip's, -A grad log pi.

Notation: logp = log pi_theta, old = log pi_old, r = exp(logp - old), A the advantage (inp.adv), all [n, T].
"""

from __future__ import annotations

import torch

from mmrl.algorithms.policy_losses import SurrogateInput, no_dual_clip, register
from mmrl.distributed.reduce import maximum, weighted_mean


def check(algo) -> None:
    """CISPO clips the importance weight itself, so it drops no gradient a dual clip could bound."""
    no_dual_clip(algo, "cispo")


@register("cispo", check=check)
def cispo(inp: SurrogateInput, spec):
    """l = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp per action, and its metrics."""
    mask = inp.mask.float()                                                    # [n, T]
    logp = inp.logp.float()                                                    # [n, T]
    log_r = logp.detach() - inp.old.float()                                    # [n, T]
    r = torch.exp(log_r)                                                       # [n, T] no grad
    w = r.clamp(1 - spec.clip_low, 1 + spec.clip_high)                         # [n, T] r_hat
    l = -w * inp.adv.float() * logp                                            # [n, T]
    n_tok = mask.sum()
    count = n_tok.clamp(min=1)
    low, high = (r < 1 - spec.clip_low) & (mask > 0), (r > 1 + spec.clip_high) & (mask > 0)
    metrics = {
        "clip_frac": weighted_mean((low | high).sum() / count, n_tok),        # weights at a bound
        "clip_frac/low": weighted_mean(low.sum() / count, n_tok),
        "clip_frac/high": weighted_mean(high.sum() / count, n_tok),
        "approx_kl": weighted_mean((((r - 1) - log_r) * mask).sum() / count, n_tok),
        "ratio/mean": weighted_mean((r * mask).sum() / count, n_tok),
        "ratio/max_abs_dev": maximum(((r - 1).abs() * mask).max()),
    }
    return l, metrics
