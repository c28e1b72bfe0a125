"""The loss of a microbatch: the policy loss's surrogate (`mmrl.algorithms.policy_losses`, algo.policy_loss),
KL estimators, the entropy bonus and loss aggregation.

Notation: per action, logp = log pi_theta, old = log pi_old, ref = log pi_ref, A the sample's advantage.
All tensors are [n, T] with `mask` [n, T] unless noted; math runs in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrl.algorithms.guard import check_terms
from mmrl.algorithms.policy_losses import SurrogateInput, resolve, surrogate
from mmrl.algorithms.policy_losses.ppo_clip import clipped_surrogate  # noqa: F401  (its home is the ppo_clip entry)
from mmrl.distributed.reduce import weighted_mean
from mmrl.registry import Registry
from mmrl.types import Scores

AGGREGATIONS: Registry = Registry("loss aggregation")
KL_ESTIMATORS: Registry = Registry("KL estimator")


@dataclass(frozen=True)
class Normalizer:
    """Totals of the whole optimizer step (all microbatches, all processes), so that
    summing microbatch losses gives exactly the loss of the full batch.

    num_seqs:    sequences in the step; num_tokens: valid actions in the step;
    max_len:     the constant of `seq-mean-token-sum-norm` (Dr.GRPO), e.g. T.
    world_size:  gradients are averaged over processes, so totals are divided by it.
    """

    num_seqs: float
    num_tokens: float
    max_len: float
    world_size: int = 1

    @staticmethod
    def of(mask: torch.Tensor, max_len: float | None = None) -> "Normalizer":
        return Normalizer(mask.shape[0], float(mask.sum()), max_len or mask.shape[1])


def _masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum()


@AGGREGATIONS.register("token-mean")
def token_mean(l, mask, norm: Normalizer):
    """Sum over all valid actions / their number (DAPO; TRL's default)."""
    return _masked_sum(l, mask) / (norm.num_tokens / norm.world_size)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(l, mask, norm: Normalizer):
    """Mean over each sequence's actions, then mean over sequences (original GRPO)."""
    per_seq = (l * mask).sum(1) / mask.sum(1).clamp(min=1)       # [n]
    return per_seq.sum() / (norm.num_seqs / norm.world_size)


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(l, mask, norm: Normalizer):
    """Sum over each sequence, mean over sequences."""
    return _masked_sum(l, mask) / (norm.num_seqs / norm.world_size)


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(l, mask, norm: Normalizer):
    """Sum over each sequence / a constant (max length), mean over sequences (Dr.GRPO)."""
    return _masked_sum(l, mask) / norm.max_len / (norm.num_seqs / norm.world_size)


def aggregate(l: torch.Tensor, mask: torch.Tensor, mode: str, norm: Normalizer | None = None):
    """Reduce per-action values l [n, T] to a scalar; `norm` defaults to this batch alone."""
    fn = AGGREGATIONS.resolve(mode, "algo.aggregation")
    return fn(l, mask.to(l.dtype), norm or Normalizer.of(mask))


@KL_ESTIMATORS.register("k1")
def kl_k1(logp, ref):
    """k1 = log pi - log pi_ref (unbiased, high variance)."""
    return logp - ref


@KL_ESTIMATORS.register("k2")
def kl_k2(logp, ref):
    """k2 = (log pi_ref - log pi)^2 / 2."""
    return 0.5 * (ref - logp) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp, ref):
    """k3 = exp(d) - d - 1 with d = log pi_ref - log pi (Schulman, low variance)."""
    d = ref - logp
    return torch.expm1(d) - d  # expm1 keeps k3 >= 0 and exact for tiny d in fp32


def kl_estimate(logp: torch.Tensor, ref: torch.Tensor, estimator: str) -> torch.Tensor:
    return KL_ESTIMATORS.resolve(estimator, "algo.kl_estimator")(logp.float(), ref.float())


@dataclass(frozen=True)
class LossSpec:
    policy_loss: str = "ppo_clip"   # a POLICY_LOSSES name or a 'module:fn' / 'file.py:fn' reference
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None  # the dual_clip loss's constant c (None: 3)
    aggregation: str = "token-mean"
    kl_beta: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    step_reweight: bool = False     # GRPO-Guard gradient reweighting (needs Scores.step_weight)


def policy_loss(scores: Scores, old, adv, mask, ref, spec: LossSpec, norm: Normalizer | None = None,
                is_weight: torch.Tensor | None = None):
    """Total loss of a microbatch: the policy loss's surrogate + beta * KL - entropy_coef * entropy,
    aggregated with `spec.aggregation`. `ref` [n, T] may be None when beta == 0 or the
    adapter supplies `scores.kl`. A loss registered with ratio_norm (grpo_guard) gets GRPO-Guard's terms
    (`mmrl.algorithms.guard`); with spec.step_reweight each action's surrogate is multiplied by
    `scores.step_weight` (the KL and entropy terms are not); likewise by `is_weight` [n, T], the
    rollout correction's importance weights (`mmrl.algorithms.rollout_correction`). Returns (loss, metrics)."""
    ratio_norm = resolve(spec.policy_loss).ratio_norm
    check_terms(scores, ratio_norm, spec.step_reweight)
    terms = (scores.step_std, scores.mean_drift) if ratio_norm else None
    a = adv.float()[:, None].expand(mask.shape) if adv.dim() == 1 else adv.float()   # [n, T]
    inp = SurrogateInput(scores.log_probs.float(), old.float(), a, mask.float(), terms)
    l, metrics = surrogate(spec.policy_loss, inp, spec)
    if spec.step_reweight:
        l = l * scores.step_weight.detach().float()                # [n, T] delta_t = 1 / dt
    if is_weight is not None:
        l = l * is_weight.detach().float()                          # [n, T] pi_old / pi_engine, banded
    maskf = mask.float()
    n_tok = maskf.sum()
    count = n_tok.clamp(min=1)
    # pg_loss is this microbatch's own aggregate: weighted by what that aggregate averages over
    per_unit = n_tok if spec.aggregation == "token-mean" else mask.shape[0]
    metrics["pg_loss"] = weighted_mean(aggregate(l.detach(), maskf, spec.aggregation), per_unit)
    if spec.kl_beta != 0:
        kl = scores.kl if scores.kl is not None else None
        if kl is None:
            if ref is None:
                raise ValueError("algo.kl_beta > 0 but the policy gave no reference log-probs")
            kl = kl_estimate(scores.log_probs, ref, spec.kl_estimator)  # [n, T]
        l = l + spec.kl_beta * kl.float()
        metrics["kl"] = weighted_mean((kl.detach().float() * maskf).sum() / count, n_tok)
    if spec.entropy_coef != 0:
        if scores.entropy is None:
            raise ValueError("algo.entropy_coef != 0 but this policy does not compute entropies")
        l = l - spec.entropy_coef * scores.entropy.float()
    if scores.entropy is not None:
        metrics["entropy"] = weighted_mean((scores.entropy.detach().float() * maskf).sum() / count, n_tok)
    return aggregate(l, maskf, spec.aggregation, norm), metrics
