"""The policy-gradient objective (`algo.objective: pg`, the default): per microbatch, the policy loss's
surrogate on the per-action log-probs (`algo.policy_loss`, `mmrl.algorithms.policy_losses`) + kl_beta * KL -
entropy_coef * entropy, aggregated over the optimizer step (`mmrl.algorithms.losses.policy_loss`), each action's
surrogate weighted by the rollout correction where the sampling engine reported its own log-probs
(`mmrl.algorithms.rollout_correction`).

    J(theta) = E[ agg_t( l(r_t, A_t) ) ] + beta KL(pi_theta || pi_ref) - c_H H(pi_theta),  r_t = pi_theta / pi_old
"""

from __future__ import annotations

import torch

from mmrl.algorithms.losses import LossSpec, Normalizer, policy_loss
from mmrl.algorithms.objectives import ObjectiveInput, register
from mmrl.algorithms.rollout_correction import weights as correction_weights
from mmrl.distributed.reduce import weighted_mean


def loss_spec(algo) -> LossSpec:
    """The algo section's keys the policy loss reads."""
    return LossSpec(policy_loss=algo.policy_loss, clip_low=algo.clip_low, clip_high=algo.clip_high,
                    dual_clip=algo.dual_clip, aggregation=algo.aggregation, kl_beta=algo.kl_beta,
                    kl_estimator=algo.kl_estimator, entropy_coef=algo.entropy_coef, step_reweight=algo.step_reweight)


@register("pg")
def policy_gradient(inp: ObjectiveInput):
    """(idx, epoch, norm) -> (loss, metrics). The reference's log-probs (once per step, only with a KL) and the old
    log-probs are computed here, before any update."""
    policy, algo, ro, adv = inp.policy, inp.algo, inp.batch.rollout, inp.advantages
    spec = loss_spec(algo)
    ref = policy.reference_log_probs(ro, torch.arange(len(ro))) if spec.kl_beta != 0 else None   # once
    old_all = inp.old_log_probs()                                               # [N, T] or None
    if algo.rollout_correction.mode != "none" and ro.engine_log_probs is None:
        raise ValueError(f"algo.rollout_correction.mode={algo.rollout_correction.mode} needs the sampling "
                         "engine's log-probs, but this rollout has none (policy.backend=vllm records them)")

    def loss_of(idx: torch.Tensor, epoch: int, norm: Normalizer):
        ref_mb = None if ref is None else ref.select(idx)                      # the KL input, explicit
        scores = policy.log_probs(ro, idx, ref_mb)                             # [n, T]
        old = scores.log_probs.detach() if old_all is None else old_all[idx]
        ref_lp = None if ref_mb is None else ref_mb.log_probs                  # [n, T] or None
        weight, extra = engine_correction(ro, idx, old, algo)
        loss, metrics = policy_loss(scores, old, adv[idx], ro.mask[idx], ref_lp, spec, norm, weight)
        return loss, {**metrics, **extra}

    return loss_of


def engine_correction(ro, idx: torch.Tensor, old: torch.Tensor, algo) -> tuple[torch.Tensor | None, dict]:
    """The rollout correction's weights [n, T] of microbatch `idx` (None when off) and the mismatch
    metrics, whenever the rollout carries the sampling engine's log-probs (`mmrl.algorithms.rollout_correction`)."""
    if ro.engine_log_probs is None:
        return None, {}
    mask = ro.mask[idx].to(old.device)
    engine = ro.engine_log_probs[idx].to(old.device)                          # [n, T]
    maskf = mask.float()
    n_tok = maskf.sum()
    diff = torch.nan_to_num((old.float() - engine.float()).abs() * maskf, nan=0.0)
    metrics = {"rollout/logprob_abs_diff": weighted_mean(diff.sum() / n_tok.clamp(min=1), n_tok)}
    rc = algo.rollout_correction
    if rc.mode == "none":
        return None, metrics
    c = correction_weights(old, engine, mask, rc.mode, rc.max, rc.min)
    metrics["rollout/is_weight_mean"] = weighted_mean(c.weight.sum() / n_tok.clamp(min=1), n_tok)
    metrics["rollout/is_outside_frac"] = weighted_mean(c.outside.float().sum() / n_tok.clamp(min=1), n_tok)
    return c.weight, metrics
