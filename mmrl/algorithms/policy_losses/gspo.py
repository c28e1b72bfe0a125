"""GSPO, group sequence policy optimization (Zheng et al., arXiv 2507.18071 eq. 5-7): `algo.policy_loss: gspo`.

    s_i(theta) = exp( (1 / |y_i|) sum_t log(pi_theta(y_i,t) / pi_old(y_i,t)) )     the sequence ratio
    l_i,t = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)                  shared by y_i's tokens

One ratio per sample (the geometric mean of its token ratios) is clipped, so a sequence is kept or dropped as
a whole; with a mixture-of-experts model the token ratios are noisy where the sequence's is not. The paper's
clip range is far narrower than PPO's (it reports eps_low = 3e-4, eps_high = 4e-4): set algo.clip_low and
algo.clip_high. Variable map: s_i -> exp(log_r) after `sequence_log_ratio`, |y_i| -> the mask's row sum.
"""

from __future__ import annotations

from mmrl.algorithms.policy_losses import SurrogateInput, no_dual_clip, register
from mmrl.algorithms.policy_losses.ppo_clip import clipped_surrogate


def check(algo) -> None:
    no_dual_clip(algo, "gspo")


@register("gspo", check=check)
def gspo(inp: SurrogateInput, spec):
    """The clipped surrogate of the sequence ratio s_i, shared by the sample's actions."""
    return clipped_surrogate(inp.logp, inp.old, inp.adv, inp.mask, clip_low=spec.clip_low, clip_high=spec.clip_high,
                             level="sequence")
