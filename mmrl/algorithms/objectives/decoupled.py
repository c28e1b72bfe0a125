"""AReaL's decoupled PPO objective (Fu et al., arXiv 2505.24298): `algo.objective: decoupled`.

PPO lets one policy play two roles: it sampled the batch, and the update's trust region is anchored at it. In
asynchronous training the actions come from older weights, so AReaL decouples the roles: the clip is anchored
at the proximal policy (the weights just before this step's update) and an importance weight from the
behaviour policy (the weights that sampled each action) to the proximal one corrects the sampling.

Notation (paper -> variable -> config key), per action a_t of a sample, all [n, T]:
    pi_theta     logp    the trained policy (with grad), `Policy.log_probs`
    pi_prox      prox    the proximal policy: a no-grad forward of the current weights before any update of the
                         step, recomputed every step (`ObjectiveInput.recompute_log_probs`), even in a single
                         on-policy pass
    pi_behav     behav   the behaviour policy, recorded at sampling time: `Rollout.engine_log_probs` where the
                         engine reported them (vLLM), else `Rollout.log_probs`
    u_t          r       pi_theta / pi_prox, the ratio of `algo.policy_loss` (its `old` is prox)
    w_t          w       pi_prox / pi_behav, no grad, truncated or masked to [algo.decoupled.min,
                         algo.decoupled.max] by algo.decoupled.mode (`mmrl.algorithms.rollout_correction.weights`)
    eps_low, eps_high    algo.clip_low, algo.clip_high
    A_t          adv     the advantage

    J(theta) = E_{a ~ pi_behav}[ w_t min(u_t A_t, clip(u_t, 1 - eps_low, 1 + eps_high) A_t) ]

so each action's loss is sg(w_t) l_t, l_t the surrogate of `algo.policy_loss` with old = prox (ppo_clip as
written; dual_clip, gspo, cispo, ... the same way), aggregated by algo.aggregation, with the KL and entropy terms
unweighted (`mmrl.algorithms.losses.policy_loss`).

AReaL's `behav_imp_weight_cap: C` (areal/utils/functional/functional.py, `ppo_actor_loss_fn`) is mode token_mask
with max C: an action with w_t > C leaves the gradient (w_t = C stays) and still counts in token-mean's
denominator; AReaL's examples set C = 5, the default here. With on-policy samples (behav == prox, a step of the
synchronous trainer sampled by its own forward) w = 1 and the loss is pg's, for one extra no-grad forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from mmrl.algorithms.losses import LossSpec, Normalizer, policy_loss
from mmrl.algorithms.objectives import ObjectiveInput, register
from mmrl.algorithms.objectives.pg import loss_spec
from mmrl.algorithms.rollout_correction import CORRECTIONS, weights
from mmrl.distributed.reduce import Metric, weighted_mean
from mmrl.errors import ConfigError
from mmrl.types import Scores


@dataclass(frozen=True)
class DecoupledConfig:
    """The `algo.decoupled` section (algo.objective=decoupled): the behaviour weight w = pi_prox / pi_behav."""

    mode: str = "token_mask"              # token_mask | token_truncate | sequence_mask | sequence_truncate (rollout_correction.py's modes)
    max: Optional[float] = 5.0            # upper bound of w (mask: drop above; truncate: clip); AReaL's behav_imp_weight_cap, 5 in its examples; null = none
    min: Optional[float] = None           # lower bound of w (mask: drop below; truncate: clip); null = none


def check(section: DecoupledConfig) -> None:
    """Load-time checks of the `algo.decoupled` section."""
    modes = [m for m in CORRECTIONS.names() if m != "none"]
    if section.mode not in modes:
        raise ConfigError(f"config key 'algo.decoupled.mode' must be one of {', '.join(modes)}; got "
                          f"{section.mode!r} (without the behaviour weight the objective is algo.objective=pg)")
    for key in ("max", "min"):
        value = getattr(section, key)
        if value is not None and not value > 0:
            raise ConfigError(f"config key 'algo.decoupled.{key}' must be > 0 or null, got {value}")
    if section.max is not None and section.max < 1:
        raise ConfigError(f"config key 'algo.decoupled.max' ({section.max}) must be >= 1 or null: on-policy actions "
                          "have w = 1 and must keep their weight (AReaL's behav_imp_weight_cap is 5 in its examples)")
    if section.min is not None and section.min > 1:
        raise ConfigError(f"config key 'algo.decoupled.min' ({section.min}) must be <= 1 or null: on-policy actions "
                          "have w = 1 and must keep their weight")
    if section.max is None and section.min is None and section.mode.endswith("truncate"):
        raise ConfigError(f"config key 'algo.decoupled.mode' is {section.mode} with neither algo.decoupled.max nor "
                          ".min set: there is nothing to clip to; for the raw weight (AReaL's "
                          "behav_imp_weight_cap: null) use algo.decoupled.mode=token_mask with max=null")


def check_algo(algo) -> None:
    """Load-time checks of algo.objective=decoupled: its section, and no rollout correction on top of it."""
    check(algo.decoupled)
    mode = algo.rollout_correction.mode
    if mode != "none":
        raise ConfigError(f"config key 'algo.rollout_correction.mode' is {mode}, but algo.objective=decoupled already "
                          "weights each action by pi_prox / pi_behav with pi_behav the sampling engine's log-probs "
                          "where the rollout has them, which covers the engine mismatch: set "
                          "algo.rollout_correction.mode=none and bound the weight with algo.decoupled.mode / .max / .min")


def behaviour_log_probs(ro) -> torch.Tensor:
    """[N, T] log pi_behav: the engine's log-probs where it reported them, else the rollout-time ones."""
    if ro.engine_log_probs is not None:
        return ro.engine_log_probs
    if ro.log_probs is not None:
        return ro.log_probs
    raise ValueError("algo.objective=decoupled needs the behaviour policy's log-probs recorded at sampling time, "
                     "but this rollout has neither Rollout.engine_log_probs nor Rollout.log_probs (the adapter "
                     "defers them to the update): record them at rollout time (the VLM: policy.old_log_probs=rollout, "
                     "or policy.backend=vllm), or use algo.objective=pg")


def decoupled_loss(scores: Scores, prox, behav, adv, mask, ref, spec: LossSpec, section: DecoupledConfig,
                   norm: Normalizer | None = None) -> tuple[torch.Tensor, dict[str, Metric]]:
    """One microbatch: prox, behav, mask [n, T], adv [n] or [n, T] -> (loss, metrics). The policy loss with old = prox,
    each action's surrogate weighted by w = pi_prox / pi_behav (banded, no grad)."""
    mask = mask.to(prox.device)
    c = weights(prox, behav.to(prox.device), mask, section.mode, section.max, section.min)   # w [n, T]
    loss, metrics = policy_loss(scores, prox, adv, mask, ref, spec, norm, c.weight)
    maskf = mask.float()
    n_tok = maskf.sum()
    count = n_tok.clamp(min=1)
    diff = torch.nan_to_num((prox.float() - behav.to(prox.device).float()).abs() * maskf, nan=0.0)   # [n, T]
    metrics["decoupled/behav_weight_mean"] = weighted_mean(c.weight.sum() / count, n_tok)
    metrics["decoupled/outside_frac"] = weighted_mean(c.outside.float().sum() / count, n_tok)
    metrics["decoupled/prox_behav_abs_diff"] = weighted_mean(diff.sum() / count, n_tok)
    return loss, metrics


@register("decoupled", check=check_algo)
def decoupled_objective(inp: ObjectiveInput):
    """(idx, epoch, norm) -> (loss, metrics). Before any update: the behaviour log-probs (checked), the reference's
    (only with a KL) and the proximal ones (a no-grad pass of the current weights, always)."""
    policy, algo, ro, adv = inp.policy, inp.algo, inp.batch.rollout, inp.advantages
    spec, section = loss_spec(algo), algo.decoupled
    behav_all = behaviour_log_probs(ro)                                         # [N, T] pi_behav
    ref = policy.reference_log_probs(ro, torch.arange(len(ro))) if spec.kl_beta != 0 else None   # once
    prox_all = inp.recompute_log_probs()                                        # [N, T] pi_prox, no grad

    def loss_of(idx: torch.Tensor, epoch: int, norm: Normalizer):
        ref_mb = None if ref is None else ref.select(idx)
        scores = policy.log_probs(ro, idx, ref_mb)                             # [n, T] pi_theta
        ref_lp = None if ref_mb is None else ref_mb.log_probs                  # [n, T] or None
        return decoupled_loss(scores, prox_all[idx], behav_all[idx], adv[idx], ro.mask[idx], ref_lp, spec, section,
                              norm)

    return loss_of
