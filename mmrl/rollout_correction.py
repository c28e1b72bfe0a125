"""Rollout-training mismatch correction (the `algo.rollout_correction` section): importance weights between the
engine that sampled a rollout (vLLM: other kernels, other precision, weights pushed a step ago) and the
trainer's own forward, which the policy gradient assumes sampled it.

With pi_old the trainer's log-probs of the sampled tokens before the update (`old`) and pi_roll the
engine's (`Rollout.engine_log_probs`), the raw weight is

    token level:     rho_t = pi_old(a_t) / pi_roll(a_t)                     per action        [n, T]
    sequence level:  rho   = prod_t rho_t = exp(sum_t (log pi_old - log pi_roll))  per sample  [n, 1]

and the weight that multiplies each action's surrogate (not the KL or entropy terms) is, with the band
[C_min, C_max] (`algo.rollout_correction.min`, `.max`):

    *_truncate (TIS, Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
                training"):           w = clamp(rho, C_min, C_max)
    *_mask     (MIS, veRL's rollout correction): w = rho inside the band, 0 outside (the action or the
                whole sequence leaves the gradient)

This is TRL's `vllm_importance_sampling_mode` (token_truncate, token_mask, sequence_truncate,
sequence_mask) with `vllm_importance_sampling_clip_max` / `_min`. The weights carry no gradient. Padding
and engine log-probs that are NaN (not reported) count as rho = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from mmrl.errors import ConfigError

MODES = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """The `algo.rollout_correction` section: importance weights pi_old / pi_engine when another engine (vLLM)
    sampled."""

    mode: str = "none"                    # none | token_truncate | token_mask | sequence_truncate | sequence_mask
    max: Optional[float] = 2.0            # C_max of the weights' band (truncate: clip; mask: drop above); null = no upper bound
    min: Optional[float] = None           # C_min (truncate: clip; mask: drop below); null = no lower bound


def check(section: RolloutCorrectionConfig) -> None:
    """Load-time checks of `algo.rollout_correction` (the policy's own support is checked with the policy)."""
    if section.mode not in MODES:
        raise ConfigError(f"config key 'algo.rollout_correction.mode' must be one of {', '.join(MODES)}; "
                          f"got {section.mode!r}")
    if section.mode == "none":
        return
    for key in ("max", "min"):
        value = getattr(section, key)
        if value is not None and not value > 0:
            raise ConfigError(f"config key 'algo.rollout_correction.{key}' must be > 0 or null, got {value}")
    if section.max is not None and section.min is not None and section.min >= section.max:
        raise ConfigError(f"config key 'algo.rollout_correction.min' ({section.min}) must be below "
                          f"algo.rollout_correction.max ({section.max})")
    if section.max is None and section.min is None and section.mode.endswith("mask"):
        raise ConfigError(f"config key 'algo.rollout_correction.mode' is {section.mode} with neither "
                          "algo.rollout_correction.max nor .min set: the mask would drop nothing")


@dataclass(frozen=True)
class Correction:
    weight: torch.Tensor     # [n, T] w, broadcast over the actions of a sample at sequence level; 0 at padding
    outside: torch.Tensor    # [n, T] bool: the action's (or its sequence's) rho left the band [C_min, C_max]


def weights(old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, mode: str, c_max: float | None,
            c_min: float | None = None) -> Correction:
    """The correction weights of one microbatch: old, engine, mask [n, T] -> `Correction`."""
    if mode not in MODES[1:]:
        raise ValueError(f"unknown rollout correction {mode!r}; valid: {', '.join(MODES)}")
    maskf = mask.float()
    diff = torch.nan_to_num((old.float() - engine.float()) * maskf, nan=0.0)       # [n, T] log rho_t
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True).expand_as(diff)                          # [n, T] log rho per sample
    rho = torch.exp(diff)
    low = -math.inf if c_min is None else c_min
    high = math.inf if c_max is None else c_max
    outside = ((rho < low) | (rho > high)) & mask.bool()
    if mode.endswith("truncate"):
        w = rho.clamp(min=c_min, max=c_max)
    else:
        w = rho.masked_fill(outside, 0.0)
    return Correction(weight=(w * maskf).detach(), outside=outside)
