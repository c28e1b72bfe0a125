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
from mmrl.registry import Registry

# mode -> fn(log_rho [n, T] per action, mask [n, T], c_min, c_max) -> Correction
CORRECTIONS: Registry = Registry("rollout correction")


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """The `algo.rollout_correction` section: importance weights pi_old / pi_engine when another engine (vLLM)
    sampled."""

    mode: str = "none"                    # none | token_truncate | token_mask | sequence_truncate | sequence_mask
    max: Optional[float] = 2.0            # C_max of the weights' band (truncate: clip; mask: drop above); null = no upper bound
    min: Optional[float] = None           # C_min (truncate: clip; mask: drop below); null = no lower bound


def check(section: RolloutCorrectionConfig) -> None:
    """Load-time checks of `algo.rollout_correction` (the policy's own support is checked with the policy)."""
    try:
        CORRECTIONS.check(section.mode, "algo.rollout_correction.mode")
    except ValueError as e:
        raise ConfigError(str(e)) from None
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


def _band(rho: torch.Tensor, mask: torch.Tensor, c_min: float | None, c_max: float | None) -> torch.Tensor:
    """[n, T] bool: rho left [C_min, C_max] (a missing bound is no bound), at valid actions."""
    low = -math.inf if c_min is None else c_min
    high = math.inf if c_max is None else c_max
    return ((rho < low) | (rho > high)) & mask.bool()


def _per_sample(log_rho: torch.Tensor) -> torch.Tensor:
    """log rho = sum_t log rho_t, broadcast over the sample's actions: [n, T] -> [n, T]."""
    return log_rho.sum(-1, keepdim=True).expand_as(log_rho)


@CORRECTIONS.register("none")
def no_correction(log_rho, mask, c_min, c_max) -> Correction:
    """w = 1 (the trainer treats its own log-probs as the sampler's)."""
    return Correction(weight=mask.float(), outside=torch.zeros_like(mask, dtype=torch.bool))


@CORRECTIONS.register("token_truncate")
def token_truncate(log_rho, mask, c_min, c_max) -> Correction:
    """TIS: w_t = clamp(rho_t, C_min, C_max)."""
    rho = torch.exp(log_rho)
    return Correction(weight=rho.clamp(min=c_min, max=c_max), outside=_band(rho, mask, c_min, c_max))


@CORRECTIONS.register("token_mask")
def token_mask(log_rho, mask, c_min, c_max) -> Correction:
    """MIS: w_t = rho_t inside the band, 0 outside (the action leaves the gradient)."""
    rho = torch.exp(log_rho)
    outside = _band(rho, mask, c_min, c_max)
    return Correction(weight=rho.masked_fill(outside, 0.0), outside=outside)


@CORRECTIONS.register("sequence_truncate")
def sequence_truncate(log_rho, mask, c_min, c_max) -> Correction:
    """w = clamp(prod_t rho_t, C_min, C_max) for every action of the sample."""
    return token_truncate(_per_sample(log_rho), mask, c_min, c_max)


@CORRECTIONS.register("sequence_mask")
def sequence_mask(log_rho, mask, c_min, c_max) -> Correction:
    """w = prod_t rho_t inside the band, else 0 for the whole sample."""
    return token_mask(_per_sample(log_rho), mask, c_min, c_max)


def weights(old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, mode: str, c_max: float | None,
            c_min: float | None = None) -> Correction:
    """The correction weights of one microbatch: old, engine, mask [n, T] -> `Correction` (weights without grad,
    0 at padding)."""
    fn = CORRECTIONS.resolve(mode, "algo.rollout_correction.mode")
    maskf = mask.float()
    log_rho = torch.nan_to_num((old.float() - engine.float()) * maskf, nan=0.0)     # [n, T] log rho_t
    c = fn(log_rho, mask, c_min, c_max)
    return Correction(weight=(c.weight * maskf).detach(), outside=c.outside)
