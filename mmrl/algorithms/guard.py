"""GRPO-Guard (Wang et al., arXiv 2510.22319): RatioNorm and per-step gradient reweighting.

Both apply to actions that are Gaussian steps x' ~ N(mu, s^2) whose log-prob is averaged over the
D dims of x' (a diffusion policy's SDE denoising steps). The adapter supplies the per-action terms in
`Scores` (step_std, mean_drift, step_weight); this module only combines them, so the core stays
modality-agnostic.

Notation (paper -> variable), per action (n, t), i.e. one denoising step of one sample:
    mu_theta, mu_old     the step's mean under the current / the rollout policy (adapter side)
    sigma_t sqrt(dt)     std      s, the step's std (Flow-GRPO: g(sigma) sqrt(sigma - sigma_next))
    ||.||^2 / D          a mean over the D latent dims (the log-prob convention of every anchor)
    log r                log_r    log pi_theta(x') - log pi_old(x')
    b                    drift    ||mu_theta - mu_old||^2 / (2 D s^2), with grad through mu_theta
    log r_hat            s * (log r + b)                          RatioNorm
    delta_t              weight   1 / dt, dt = sigma_t - sigma_{t+1}   gradient reweighting

Why (the paper's analysis, derived here for the mean-over-dims log-prob): the rollout drew
x' = mu_old + s eps, eps ~ N(0, I), so with Delta = mu_theta - mu_old
    log r = mean_d(eps Delta) / s - b
has mean -b < 0 over eps (the ratio sits left of 1, so positive-advantage samples never reach
the 1 + eps_high clip) and a spread ~ 1/s that differs from step to step. RatioNorm adds b back
and rescales by s:
    log r_hat = mean_d(eps Delta)
with mean 0 and a spread that no longer depends on s. On-policy (mu_theta == mu_old, log r = 0)
b = 0 and r_hat = exp(0) = 1 exactly. Its gradient is eps * d mu_theta / D, and d mu_theta / d v
carries a factor dt (the Euler step), so the steps' gradients differ by their dt; the surrogate
of each action is multiplied by 1 / dt to equalise them (the KL term is not reweighted, as in the
paper's code). Both options shrink the log-ratio's scale by about s: the clip range must shrink
with it (reference implementations use 1e-4 down to 2e-6).
"""

from __future__ import annotations

import torch


def ratio_norm(log_r: torch.Tensor, std: torch.Tensor, drift: torch.Tensor) -> torch.Tensor:
    """RatioNorm: log r_hat = s * (log r + b), all [n, T], fp32 (drift keeps its grad)."""
    return std.float() * (log_r.float() + drift.float())                     # [n, T]


def check_terms(scores, ratio_norm_on: bool, step_reweight_on: bool) -> None:
    """Raise ValueError naming the algo key when the policy did not supply what it needs."""
    if ratio_norm_on and (scores.step_std is None or scores.mean_drift is None):
        raise ValueError("algo.policy_loss=grpo_guard (RatioNorm) but the policy gave no Scores.step_std / "
                         "Scores.mean_drift "
                         "(RatioNorm needs Gaussian actions whose rollout means were recorded)")
    if step_reweight_on and scores.step_weight is None:
        raise ValueError("algo.step_reweight is true but the policy gave no Scores.step_weight")
