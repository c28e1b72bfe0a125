"""GRPO-Guard's RatioNorm (Wang et al., arXiv 2510.22319), for policies whose actions are Gaussian denoising
steps: `algo.policy_loss: grpo_guard`.

    log r_hat = s (log r + b)                                     RatioNorm (mmrl/algorithms/guard.py)
    l = -min(r_hat A, clip(r_hat, 1 - eps_low, 1 + eps_high) A)

where s is the step's std and b = ||mu_theta - mu_old||^2 / (2 D s^2) the mean drift, both supplied by the
adapter in `Scores` (step_std, mean_drift; the rollout records each trained step's mean because this entry is
registered with ratio_norm=True). RatioNorm shrinks the log-ratio's scale by about s, so the clip range must
shrink with it (the reference code uses 1e-4 down to 2e-6). The paper's other half, the 1/dt gradient
reweighting of each step, is `algo.step_reweight` (flow families only), applied by the core to any loss.
Metrics: ratio/raw_mean (the un-normalised ratio) and ratio_norm/drift (the mean b).
"""

from __future__ import annotations

from mmrl.algorithms.policy_losses import SurrogateInput, no_dual_clip, register
from mmrl.algorithms.policy_losses.ppo_clip import clipped_surrogate


def check(algo) -> None:
    no_dual_clip(algo, "grpo_guard")


@register("grpo_guard", check=check, ratio_norm=True)
def grpo_guard(inp: SurrogateInput, spec):
    """The clipped surrogate of RatioNorm's r_hat."""
    if inp.guard is None:
        raise ValueError("algo.policy_loss=grpo_guard but the policy gave no Scores.step_std / Scores.mean_drift "
                         "(RatioNorm needs Gaussian actions whose rollout means were recorded)")
    return clipped_surrogate(inp.logp, inp.old, inp.adv, inp.mask, clip_low=spec.clip_low, clip_high=spec.clip_high,
                             norm=inp.guard)
