"""DiffusionNFT (Zheng et al., arXiv 2509.16117): the forward-process objective, `algo.objective: nft`.

`algo.objective: nft` trains on the same rollouts, rewards and advantages as the policy gradient,
but through a flow-matching loss on the clean samples instead of per-action log-probs. This module
holds the modality-agnostic parts; the adapter (`Policy.forward_process_loss`) noises its samples,
runs its model and calls `nft_loss` with the velocities.

Notation (paper -> variable), per sample x0 with prompt c:
    A                    adv        the group-normalised advantage (mmrl.algorithms.advantages)
    Z                    scale      algo.nft.adv_scale: r = 1/2 + 1/2 clip(A / Z, -1, 1) (the paper's
                                    optimality probability; the official code's Z is its advantage clip, 5)
    t, eps               t          a flow time and N(0, I) noise; x_t = (1 - t) x0 + t eps
    v                    v_target   eps - x0, the flow-matching target
    v_old, v_theta       v_old, v_theta   the sampling ("old") policy's velocity (no grad), the trained one's
    beta                 beta       algo.nft.beta
    v+ = (1 - beta) v_old + beta v_theta      the implicit positive policy
    v- = (1 + beta) v_old - beta v_theta      the implicit negative policy
    L = [r ||v+ - v||^2 + (1 - r) ||v- - v||^2] / beta      ||.||^2 the mean over the D dims
    eta_k                decay      old <- eta_k old + (1 - eta_k) theta after training step k

The 1 / beta follows the official code (NVlabs/DiffusionNFT, scripts/train_nft_sd3.py); with it,
dL/dv_theta = 2 / D [r (v+ - v) - (1 - r) (v- - v)], which at v_theta == v_old (the first update of
a step with eta = 0) is (2r - 1) times the gradient of the flow-matching loss ||v_theta - v||^2:
positive samples (r > 1/2) are fitted, negative ones pushed away, r = 1/2 pulls v_theta to v_old.
beta = 1, r = 1 is plain flow matching on the sample (v+ = v_theta).

Adaptive weighting (the official code): each branch's error is measured on the clean sample it
implies, x0_hat = x_t - t v_branch, so x0_hat - x0 = t (eps - x0) - t v_branch = -t (v_branch - v),
and divided by its own mean absolute value (no grad): ||e||^2 / sg(mean |e|), e = t (v_branch - v).

Regularisation (the official code): with algo.kl_beta > 0 each sample's loss adds kl_beta ||v_theta - v_ref||^2 / D,
v_ref the reference (pretrained) model's velocity at the same x_t (`ForwardLoss.kl`; the code uses 1e-4).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from mmrl.algorithms.objectives import ObjectiveInput, register
from mmrl.distributed.reduce import Metric, mean, weighted_mean
from mmrl.errors import ConfigError

ADAPTIVE_FLOOR = 1e-5   # the official code's clip of the adaptive weight's denominator


@dataclass(frozen=True)
class NFTConfig:
    """The `algo.nft` section (algo.objective=nft)."""

    beta: float = 1.0                     # beta of the implicit policies v+- = v_old +- beta (v_theta - v_old); the loss is divided by it
    adv_scale: float = 5.0                # Z of the optimality probability r = 1/2 + 1/2 clip(A / Z, -1, 1)
    adaptive_weight: bool = True          # each branch's x0 error divided by its own mean |error| (official code)
    timesteps: int = 0                    # flow times per sample, distinct steps of the rollout schedule; 0 = all of them
    old_decay_rate: float = 0.001         # sampling policy old <- eta old + (1 - eta) theta after training step k,
    old_decay_max: float = 0.5            #   eta = min(rate (k - delay), max), 0 before `delay` steps
    old_decay_delay: int = 0


# policy-gradient options that have no meaning for the forward-process loss: algo key -> its value that is off
PG_ONLY = {"policy_loss": "ppo_clip", "step_reweight": False, "entropy_coef": 0.0, "credit.name": "trajectory"}


def check_algo(algo) -> None:
    """Load-time checks of algo.objective=nft: the `algo.nft` section, and no policy-gradient-only option set."""
    check(algo.nft)
    for key, off in PG_ONLY.items():
        value = operator.attrgetter(key)(algo)                               # dotted: credit.name
        if value != off:
            raise ConfigError(f"config key 'algo.{key}' is {value!r}, an option of the policy gradient; "
                              f"algo.objective=nft trains a forward-process loss without per-action log-probs: set "
                              f"algo.{key}={off}, or algo.objective=pg")


def check(section: NFTConfig) -> None:
    """Load-time checks of the `algo.nft` section."""
    positive = {"beta": section.beta, "adv_scale": section.adv_scale}
    for key, value in positive.items():
        if not value > 0:
            raise ConfigError(f"config key 'algo.nft.{key}' must be > 0, got {value}")
    at_least = {"timesteps": section.timesteps, "old_decay_rate": section.old_decay_rate,
                "old_decay_delay": section.old_decay_delay}
    for key, value in at_least.items():
        if value < 0:
            note = " (0 = every step of the rollout schedule)" if key == "timesteps" else ""
            raise ConfigError(f"config key 'algo.nft.{key}' must be >= 0{note}, got {value}")
    if not 0 <= section.old_decay_max < 1:
        raise ConfigError(f"config key 'algo.nft.old_decay_max' must be in [0, 1), got {section.old_decay_max}")


@dataclass(frozen=True)
class NFTSpec:
    """What `Policy.forward_process_loss` needs besides the samples and their r.

    beta:            algo.nft.beta
    adaptive_weight: algo.nft.adaptive_weight (the x0-error self-normalised weighting)
    timesteps:       algo.nft.timesteps, flow times per sample (0 = every step of the rollout schedule)
    kl:              whether to return `ForwardLoss.kl`, the velocity distance to the reference model
    draw:            the update epoch: the adapter seeds each sample's t and eps from its rollout seed and
                     `draw`, so an epoch's noise is reproducible on any number of processes
    """

    beta: float = 1.0
    adaptive_weight: bool = True
    timesteps: int = 0
    kl: bool = False
    draw: int = 0


def optimality(adv: torch.Tensor, scale: float) -> torch.Tensor:
    """r = 1/2 + 1/2 clip(A / Z, -1, 1) in [0, 1], for advantages adv [N] (0 for unscorable samples -> 1/2)."""
    return 0.5 + 0.5 * (adv.float() / scale).clamp(-1.0, 1.0)                 # [N]


def old_decay(k: int, rate: float, cap: float, delay: int) -> float:
    """eta_k = 0 before `delay` steps, then min(rate (k - delay), cap); k = training steps done.
    The official schedules: (rate, cap, delay) = (0.001, 0.5, 0) and (0.0075, 0.999, 75); rate 0 keeps
    old == theta after every step (on-policy)."""
    return 0.0 if k < delay else min(rate * (k - delay), cap)


def _branch_error(d: torch.Tensor, t: torch.Tensor, adaptive: bool) -> torch.Tensor:
    """Per-row squared error [B] of a branch whose velocity error is d [B, ...] at times t [B]."""
    dims = tuple(range(1, d.dim()))
    if not adaptive:
        return d.pow(2).mean(dims)                                           # [B] ||v_branch - v||^2 / D
    e = t.view(-1, *[1] * (d.dim() - 1)) * d                                 # [B, ...] the x0 error (sign aside)
    w = e.detach().abs().mean(dims, keepdim=True).clamp(min=ADAPTIVE_FLOOR)  # [B, 1, ...] sg(mean |e|)
    return (e.pow(2) / w).mean(dims)                                         # [B]


def nft_loss(v_theta, v_old, v_target, r, t, beta: float, adaptive: bool = True):
    """The DiffusionNFT loss of B noised rows (velocities [B, ...], r and t [B]) -> (loss [B], metrics).

    fp32 inside; v_old and v_target carry no grad. Metrics are means over the rows, weighted by B."""
    v_theta, v_old, v_target = v_theta.float(), v_old.detach().float(), v_target.detach().float()
    r, t = r.detach().float(), t.detach().float()
    v_pos = (1 - beta) * v_old + beta * v_theta                               # [B, ...] v+
    v_neg = (1 + beta) * v_old - beta * v_theta                               # [B, ...] v-
    l_pos = _branch_error(v_pos - v_target, t, adaptive)                      # [B]
    l_neg = _branch_error(v_neg - v_target, t, adaptive)                      # [B]
    loss = (r * l_pos + (1 - r) * l_neg) / beta                               # [B]
    b = loss.shape[0]
    with torch.no_grad():
        dims = tuple(range(1, v_theta.dim()))
        metrics: dict[str, Metric] = {
            "nft/loss_pos": weighted_mean(l_pos.mean(), b),
            "nft/loss_neg": weighted_mean(l_neg.mean(), b),
            # ||v_theta - v_old||^2 / D: how far the trained policy has moved from the sampling one
            "nft/old_deviate": weighted_mean((v_theta - v_old).pow(2).mean(dims).mean(), b),
        }
    return loss, metrics


def update_old_policy(policy, algo, step: int) -> dict[str, Metric]:
    """After training step `step` (0-based): old <- eta old + (1 - eta) theta in the adapter."""
    section = algo.nft
    eta = old_decay(step + 1, section.old_decay_rate, section.old_decay_max, section.old_decay_delay)
    policy.update_old(eta)
    return {"nft/old_decay": mean(eta)}


@register("nft", after_update=update_old_policy, check=check_algo)
def forward_process_objective(inp: ObjectiveInput):
    """The microbatch loss for algo.objective=nft: r from the sample advantages, the adapter's per-sample loss
    (+ kl_beta * its KL), summed over the microbatch / the optimizer step's samples."""
    a, policy, ro = inp.algo, inp.policy, inp.batch.rollout
    r = optimality(inp.batch.advantages, a.nft.adv_scale)                     # [N]

    def loss_of(idx: torch.Tensor, epoch: int, norm):
        spec = NFTSpec(beta=a.nft.beta, adaptive_weight=a.nft.adaptive_weight, timesteps=a.nft.timesteps,
                       kl=a.kl_beta != 0, draw=epoch)
        out = policy.forward_process_loss(ro, idx, r[idx], spec)
        per_sample = out.loss.float()                                         # [n]
        metrics = dict(out.metrics)
        n = per_sample.shape[0]
        if a.kl_beta != 0:
            if out.kl is None:
                raise ValueError("algo.kl_beta > 0 but the policy's forward_process_loss returned no kl")
            per_sample = per_sample + a.kl_beta * out.kl.float()              # [n]
            metrics["kl"] = weighted_mean(out.kl.detach().float().mean(), n)
        metrics["nft/r_mean"] = weighted_mean(r[idx].mean(), n)
        metrics["nft/loss"] = weighted_mean(out.loss.detach().float().mean(), n)
        return per_sample.sum() / (norm.num_seqs / norm.world_size), metrics

    return loss_of

