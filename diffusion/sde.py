"""Diffusion samplers as policies: one SDE denoising step with its Gaussian log-probability.

Each step is a pure function. With ``prev_sample=None`` it draws ``x' = mean + std * z`` with
``z = torch.randn(..., generator=generator)`` (fp32, on the sample's device); with ``prev_sample`` given it
scores that stored transition instead. Both paths return the same ``SDEStep``. All math is fp32 whatever the
input dtype; ``prev_sample`` and ``mean`` come back in ``sample.dtype``, ``log_prob`` and ``std`` stay fp32.
The log-prob is computed from ``prev_sample`` *after* the cast to ``sample.dtype``, so re-scoring a stored
sample reproduces it exactly (on-policy ratio 1).

Coefficients (``sigma``, ``sigma_next``, ``alpha_prod_*``) are python floats, 0-dim tensors or ``[B]``
tensors (one per batch row, broadcast over the non-batch dims). Callers index them by integer step from
plain tensors; nothing here looks a timestep up or keeps schedule state.

Deterministic steps: where ``std == 0`` (``noise_level=0``, ``eta=0``, a DDIM step to alpha 1, or a ``cps``
step to sigma 0) the transition is a point mass. Such a row's sample is ``mean`` (exactly the ODE / DDIM
step) and its ``log_prob`` is defined as 0, sampled or scored (``prev_sample`` is not checked against
``mean``): the ratio of a deterministic step is 1 and it carries no policy gradient. ``gaussian_kl`` is 0
there too.

Notation (variable -> paper symbol):
    sample           x_t (DDIM) / x_sigma (flow matching), the current latent
    velocity         v_theta(x_sigma, sigma) = noise - x0, the flow-matching model output
    sigma, sigma_next  sigma_t, sigma_{t-1}; dt = sigma_next - sigma < 0 (sigma runs 1 -> 0)
    g                diffusion coefficient g(sigma) of the reverse SDE (Flow-GRPO's sigma_t)
    noise_level      a (Flow-GRPO and its CPS sampler) / eta (DanceGRPO)
    alpha_prod_t     \\bar{alpha}_t = alphas_cumprod[t];  alpha_prod_prev: \\bar{alpha}_{t_prev}
    x0_hat, eps_hat  predicted clean sample f_theta(x_t, t) and predicted noise eps_theta(x_t, t)
                     (flow matching: x - sigma v and x + (1 - sigma) v)
    c                CPS: the noise coefficient sqrt(sigma_next^2 - std^2) of its mean
    eta              DDIM eta (0: DDIM, 1: DDPM-like variance)
    mean, std        mu_theta and sigma of the Gaussian policy pi(x_{t-1} | x_t)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

FLOW_SCHEDULES = ("flow_grpo", "dance_grpo", "cps")
PREDICTION_TYPES = ("epsilon", "v_prediction")
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class SDEStep:
    """One denoising transition x -> x' ~ N(mean, std^2).

    prev_sample: [B, ...] x', drawn or the given one, in ``sample.dtype``.
    log_prob:    [B] fp32, mean over all non-batch dims of the elementwise log N(x'; mean, std^2)
                 (0 for rows with std == 0, see the module docstring).
    mean:        [B, ...] mu, in ``sample.dtype``.
    std:         [B, 1, ..., 1] fp32 (one value per row, as many dims as the sample), the true std of x':
                 for flow_grpo / dance_grpo it already includes the sqrt(sigma - sigma_next) factor; for cps
                 it is sigma_next sin(a pi / 2).
    """

    prev_sample: Tensor
    log_prob: Tensor
    mean: Tensor
    std: Tensor


def _coef(value: float | Tensor, sample: Tensor) -> Tensor:
    """A float, 0-dim or [B] tensor -> fp32 tensor broadcastable to ``sample`` (0-dim or [B, 1, ..., 1])."""
    t = torch.as_tensor(value, dtype=torch.float32, device=sample.device)
    if t.ndim == 0:
        return t
    if t.ndim != 1 or t.shape[0] != sample.shape[0]:
        raise ValueError(
            f"step coefficients must be floats or [B] tensors with B={sample.shape[0]}, got shape {tuple(t.shape)}"
        )
    return t.view(-1, *([1] * (sample.ndim - 1)))  # [B, 1, ..., 1]


def _row_mean(x: Tensor) -> Tensor:
    return x.reshape(x.shape[0], -1).mean(dim=1)  # [B]


def _log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """[B] mean over non-batch dims of log N(x; mean, std^2); 0 where std == 0 (point mass)."""
    random = std > 0  # [B, 1, ..., 1]
    safe = torch.where(random, std, torch.ones_like(std))  # avoids 0/0 and NaN gradients
    lp = -((x.float() - mean) ** 2) / (2 * safe**2) - torch.log(safe) - _LOG_SQRT_2PI  # [B, ...]
    return _row_mean(torch.where(random, lp, torch.zeros_like(lp)))  # [B]


def _gaussian_step(mean: Tensor, std: Tensor, sample: Tensor, prev_sample: Tensor | None, generator,
                   variance_noise: Tensor | None = None) -> SDEStep:
    """Sample (or score) x' ~ N(mean, std^2); ``mean`` [B, ...] fp32, ``std`` 0-dim or [B, 1, ..., 1] fp32.
    ``variance_noise`` (as in diffusers' DDIMScheduler.step) is the standard normal draw z to use
    instead of drawing one from ``generator``."""
    std = std.expand(sample.shape[0], *([1] * (sample.ndim - 1)))  # [B, 1, ..., 1]
    if prev_sample is None:
        z = (variance_noise.float() if variance_noise is not None else
             torch.randn(sample.shape, generator=generator, device=sample.device, dtype=torch.float32))
        prev_sample = mean + std * z  # [B, ...]
    prev_sample = prev_sample.to(sample.dtype)  # score the value that is returned / stored
    return SDEStep(prev_sample, _log_prob(prev_sample, mean, std), mean.to(sample.dtype), std)


def _flow_g(schedule: str, noise_level: float, sigma: Tensor, sigma_next: Tensor) -> Tensor:
    if schedule == "flow_grpo":
        # Flow-GRPO (arXiv 2505.05470): g = a * sqrt(sigma / (1 - sigma)); where sigma == 1 the
        # denominator uses sigma_next instead (compared on the value, elementwise).
        denom = 1 - torch.where(sigma >= 1, sigma_next, sigma)  # [B, 1, ..., 1] or []
        return noise_level * torch.sqrt(sigma / denom)
    if schedule == "dance_grpo":
        # DanceGRPO (arXiv 2505.07818): constant g = eta.
        return torch.full_like(sigma, float(noise_level))
    raise ValueError(f"unknown flow SDE schedule {schedule!r}; valid: {', '.join(FLOW_SCHEDULES)}")


def _cps_mean_std(v: Tensor, x: Tensor, sigma: Tensor, sigma_next: Tensor, noise_level: float):
    """Coefficient-preserving sampling (arXiv 2509.05952; Flow-GRPO's ``sde_type='cps'``).

    x' = (1 - sigma_next) x0_hat + c eps_hat + std z, std = sigma_next sin(a pi / 2),
    c = sqrt(sigma_next^2 - std^2): the noise coefficients keep c^2 + std^2 = sigma_next^2, as in the forward
    process. That gives the forward marginal at sigma_next only where x0_hat and eps_hat are exact: the std does
    not shrink with the step size, so this is no discretised SDE of the flow.
    """
    # 1. predicted noise; the predicted clean sample x0_hat = x - sigma v enters through step 3's Euler form
    eps_hat = x + (1 - sigma) * v  # [B, C, H, W]
    # 2. std and the noise coefficient of the mean (clamped against fp32 round-off below 0)
    std = sigma_next * math.sin(noise_level * math.pi / 2)  # [B, 1, 1, 1] or []
    c = torch.sqrt((sigma_next**2 - std**2).clamp(min=0))  # [B, 1, 1, 1] or []
    # 3. mean = (1 - sigma_next) x0_hat + c eps_hat. (1 - sigma_next) x0_hat + sigma_next eps_hat is the Euler
    #    step x + dt v, so the mean is written as that plus (c - sigma_next) eps_hat: the same value, and at
    #    a = 0 (c = sigma_next) the Euler step bit for bit
    mean = x + (sigma_next - sigma) * v + (c - sigma_next) * eps_hat  # [B, C, H, W]
    return mean, std


def flow_sde_step(
    velocity: Tensor,
    sample: Tensor,
    sigma: float | Tensor,
    sigma_next: float | Tensor,
    *,
    noise_level: float,
    schedule: str = "flow_grpo",
    prev_sample: Tensor | None = None,
    generator: torch.Generator | None = None,
    variance_noise: Tensor | None = None,
) -> SDEStep:
    """Stochastic step of a flow-matching model (x_sigma = (1 - sigma) x0 + sigma noise, v = noise - x0).

    ``schedule``: ``flow_grpo`` and ``dance_grpo`` are reverse SDEs with diffusion g(sigma) (the ODE's
    marginals, std = g sqrt(-dt)); ``cps`` is coefficient-preserving sampling (std = sigma_next sin(a pi / 2),
    a in [0, 1]; deterministic at sigma_next = 0). With ``noise_level=0`` each is exactly the Euler step
    x' = x + dt v (``FlowMatchEulerDiscreteScheduler.step``). Requires sigma > 0 and sigma_next <= sigma.

    ``log_prob`` is the exact Gaussian one for every schedule. Flow-GRPO's cps code returns -(x' - mean)^2
    averaged over dims instead (constants and 1/(2 std^2) dropped): not a log-density, and its log-ratios are
    these times 2 std^2, so its clip range means something else.
    """
    x = sample.float()  # [B, C, H, W]
    v = velocity.float()  # [B, C, H, W]
    sigma, sigma_next = _coef(sigma, x), _coef(sigma_next, x)  # [B, 1, 1, 1] or []
    if schedule == "cps":
        mean, std = _cps_mean_std(v, x, sigma, sigma_next, noise_level)  # [B, C, H, W], [B, 1, 1, 1] or []
        return _gaussian_step(mean, std, sample, prev_sample, generator, variance_noise)
    g = _flow_g(schedule, noise_level, sigma, sigma_next)  # [B, 1, 1, 1] or []
    dt = sigma_next - sigma  # [B, 1, 1, 1] or [], < 0
    # 1. drift: v minus g^2/2 times the score, score = -(x + (1 - sigma) v) / sigma
    mean = x + dt * (v + g**2 / (2 * sigma) * (x + (1 - sigma) * v))  # [B, C, H, W]
    # 2. diffusion over the step: s = g sqrt(-dt)
    std = g * torch.sqrt(-dt)  # [B, 1, 1, 1] or []
    return _gaussian_step(mean, std, sample, prev_sample, generator, variance_noise)


def ddim_sde_step(
    model_output: Tensor,
    sample: Tensor,
    alpha_prod_t: float | Tensor,
    alpha_prod_prev: float | Tensor,
    *,
    eta: float,
    prediction_type: str = "epsilon",
    prev_sample: Tensor | None = None,
    generator: torch.Generator | None = None,
    variance_noise: Tensor | None = None,
) -> SDEStep:
    """DDIM step with eta as a Gaussian policy (DDPO, arXiv 2305.13301; DDIM eqs. 12 and 16).

    Matches ``DDIMScheduler.step`` with ``clip_sample=False, thresholding=False`` (no x0 clipping here).
    ``alpha_prod_prev`` is alphas_cumprod[t_prev], or the final alpha (1 or alphas_cumprod[0]) at the last
    step. ``eta`` is in [0, 1].
    """
    x = sample.float()  # [B, C, H, W]
    out = model_output.float()  # [B, C, H, W]
    a_t, a_p = _coef(alpha_prod_t, x), _coef(alpha_prod_prev, x)  # [B, 1, 1, 1] or []
    # 1. predicted x0 and noise from the model output
    if prediction_type == "epsilon":
        eps = out  # [B, C, H, W]
        x0 = (x - torch.sqrt(1 - a_t) * eps) / torch.sqrt(a_t)  # [B, C, H, W]
    elif prediction_type == "v_prediction":
        x0 = torch.sqrt(a_t) * x - torch.sqrt(1 - a_t) * out  # [B, C, H, W]
        eps = torch.sqrt(a_t) * out + torch.sqrt(1 - a_t) * x  # [B, C, H, W]
    else:
        raise ValueError(f"unknown prediction_type {prediction_type!r}; valid: {', '.join(PREDICTION_TYPES)}")
    # 2. variance sigma_t(eta)^2 = eta^2 (1 - a_p) / (1 - a_t) (1 - a_t / a_p); the last factor as
    #    (a_p - a_t) / a_p: near the last step a_t / a_p rounds to about 1 in fp32 and 1 - it loses digits
    var = (1 - a_p) / (1 - a_t) * ((a_p - a_t) / a_p)  # [B, 1, 1, 1] or []
    std = eta * torch.sqrt(var)  # [B, 1, 1, 1] or []
    # 3. mean: sqrt(a_p) x0_hat + "direction pointing to x_t" (clamped against fp32 round-off below 0)
    mean = torch.sqrt(a_p) * x0 + torch.sqrt((1 - a_p - std**2).clamp(min=0)) * eps  # [B, C, H, W]
    return _gaussian_step(mean, std, sample, prev_sample, generator, variance_noise)


def gaussian_kl(mean: Tensor, mean_ref: Tensor, std: Tensor) -> Tensor:
    """Exact KL(N(mean, std^2) || N(mean_ref, std^2)) for two Gaussians with the same std -> [B] fp32.

    Elementwise ||mean - mean_ref||^2 / (2 std^2), *averaged* (not summed) over the non-batch dims to match
    the ``log_prob`` convention. ``std`` broadcasts to ``mean`` (e.g. ``SDEStep.std``); rows with std == 0
    (deterministic steps) give 0.
    """
    std = std.float()
    random = std > 0
    safe = torch.where(random, std, torch.ones_like(std))
    kl = (mean.float() - mean_ref.float()) ** 2 / (2 * safe**2)  # [B, ...]
    return _row_mean(torch.where(random, kl, torch.zeros_like(kl)))  # [B]
