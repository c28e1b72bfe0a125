"""Dual-clip PPO (Ye et al., "Mastering Complex Control in MOBA Games with Deep RL", arXiv 1912.09729 eq. 5):
`algo.policy_loss: dual_clip`, with the constant c in `algo.dual_clip` (null: 3, the paper's value).

    l = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)          PPO's clip (ppo_clip.py)
    l = min(l, -c A)                                              for A < 0 only

With a negative advantage PPO's loss -r A grows without bound as r grows (the clip only bounds r from below
when A < 0); the second clip caps it at c |A|, so one stale, very likely action cannot dominate the step.
veRL's `clip_ratio_c` (default 3) is the same constant.
"""

from __future__ import annotations

from mmrl.algorithms.policy_losses import SurrogateInput, register
from mmrl.algorithms.policy_losses.ppo_clip import clipped_surrogate
from mmrl.errors import ConfigError

DEFAULT_C = 3.0


def check(algo) -> None:
    if algo.dual_clip is not None and algo.dual_clip <= 1:
        raise ConfigError(f"config key 'algo.dual_clip' must be > 1 (typically 3) or null (3), got {algo.dual_clip}")


@register("dual_clip", check=check)
def dual_clip(inp: SurrogateInput, spec):
    """PPO's clipped surrogate, then min(l, -c A) where A < 0 (metric clip_frac/dual: the actions it caps)."""
    c = DEFAULT_C if spec.dual_clip is None else spec.dual_clip
    return clipped_surrogate(inp.logp, inp.old, inp.adv, inp.mask, clip_low=spec.clip_low, clip_high=spec.clip_high,
                             dual_clip=c)
