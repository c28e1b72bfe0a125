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

FLOW_SCHEDULES = ("flow_grpo", "dance_grpo", "linear", "cps")
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


@dataclass(frozen=True)
class StepCoefs:
    """One step's Gaussian policy as an affine map of the latent and the model output:
    x' ~ N(mean, std^2), mean = a x + b out, and its log-density constants, so that

        log_prob = lconst - inv2var * mean_d((x' - mean)^2)   (lconst = -log std - log sqrt(2 pi),
                                                                 inv2var = 1 / (2 std^2))

    with ``inv2var = lconst = 0`` where std == 0 (a point mass: log_prob 0, no gradient). Every field has one
    shape: a schedule's [S] table, [B, 1, ..., 1] rows, or 0-dim (a rollout step's); all fp32. Sampling and
    scoring compute the mean with the same two products and one sum whatever that shape (elementwise fp32
    products and sums round the same way), so a stored transition is re-scored bit for bit.
    """

    a: Tensor | float
    b: Tensor | float
    std: Tensor | float
    inv2var: Tensor | float
    lconst: Tensor | float

    @classmethod
    def of(cls, a: Tensor, b: Tensor, std: Tensor) -> StepCoefs:
        random = std > 0
        safe = torch.where(random, std, torch.ones_like(std))  # avoids 1/0 and log 0
        inv2var = torch.where(random, 1 / (2 * safe**2), torch.zeros_like(std))
        lconst = torch.where(random, -torch.log(safe) - _LOG_SQRT_2PI, torch.zeros_like(std))
        return cls(a, b, std, inv2var, lconst)

    def rows(self, index: Tensor, ndim: int) -> StepCoefs:
        """The [S] table at steps ``index`` [B] -> [B, 1, ..., 1] rows for samples of ``ndim`` dims."""
        shape = (-1, *([1] * (ndim - 1)))
        return StepCoefs(*(t[index].view(shape) for t in self._fields()))

    def per_step(self) -> list[StepCoefs]:
        """The [S] table as S steps of 0-dim fp32 tensors (multiplying by one is one op, no conversion)."""
        return [StepCoefs(*(t[i] for t in self._fields())) for i in range(self.a.shape[0])]

    def _fields(self) -> tuple:
        return self.a, self.b, self.std, self.inv2var, self.lconst


def affine_mean(c: StepCoefs, x: Tensor, out: Tensor) -> Tensor:
    """mean = a x + b out [B, ...] fp32 (``c``'s fields tensors or python floats)."""
    return x * c.a + out * c.b


def gaussian_log_prob(x_next: Tensor, mean: Tensor, c: StepCoefs) -> Tensor:
    """[B] mean over non-batch dims of log N(x'; mean, std^2), 0 where std == 0; ``x_next`` is scored as
    given (cast to fp32), ``c``'s fields are [B, 1, ..., 1] or 0-dim tensors or python floats."""
    sq = _row_mean((x_next.float() - mean) ** 2)  # [B]
    inv2var, lconst = (t.reshape(-1) if isinstance(t, Tensor) else t for t in (c.inv2var, c.lconst))
    return lconst - inv2var * sq  # [B]


def gaussian_step(c: StepCoefs, out: Tensor, sample: Tensor, prev_sample: Tensor | None = None,
                  generator: torch.Generator | None = None, variance_noise: Tensor | None = None) -> SDEStep:
    """Sample (or score) x' ~ N(a x + b out, std^2) for one step of rows ``sample`` [B, ...]; ``c``'s fields
    0-dim or [B, 1, ..., 1]. ``variance_noise`` (as in diffusers' DDIMScheduler.step) is the standard
    normal draw z to use instead of drawing one from ``generator``."""
    x = sample.float()  # [B, ...]
    mean = affine_mean(c, x, out.float())  # [B, ...]
    if prev_sample is None:
        z = (variance_noise.float() if variance_noise is not None else
             torch.randn(sample.shape, generator=generator, device=sample.device, dtype=torch.float32))
        prev_sample = mean + c.std * z  # [B, ...]
    prev_sample = prev_sample.to(sample.dtype)  # score the value that is returned / stored
    std = c.std.expand(sample.shape[0], *([1] * (sample.ndim - 1)))  # [B, 1, ..., 1]
    return SDEStep(prev_sample, gaussian_log_prob(prev_sample, mean, c), mean.to(sample.dtype), std)


def _flow_g(schedule: str, noise_level: float, sigma: Tensor, sigma_next: Tensor,
            sigma_range: tuple[float, float] | None) -> Tensor:
    if schedule == "flow_grpo":
        # Flow-GRPO (arXiv 2505.05470): g = a * sqrt(sigma / (1 - sigma)); where sigma == 1 the
        # denominator uses sigma_next instead (compared on the value, elementwise).
        denom = 1 - torch.where(sigma >= 1, sigma_next, sigma)  # [B, 1, ..., 1] or []
        return noise_level * torch.sqrt(sigma / denom)
    if schedule == "dance_grpo":
        # DanceGRPO (arXiv 2505.07818): constant g = eta.
        return torch.full_like(sigma, float(noise_level))
    if schedule == "linear":
        # Flow-GRPO's Wan 2.1 trainer: g linear in sigma, g = a (sigma_min + (sigma_max - sigma_min) sigma) with
        # sigma_max the schedule's second sigma and sigma_min its last (0), a = 1 there. Finite as sigma -> 1,
        # where flow_grpo's sqrt(sigma / (1 - sigma)) is not (Wan's UniPC sigmas start at 1 - 1e-6, not 1).
        if sigma_range is None:
            raise ValueError("the linear SDE schedule needs sigma_range = (sigma_min, sigma_max) of its schedule")
        lo, hi = sigma_range
        return noise_level * (lo + (hi - lo) * sigma)
    raise ValueError(f"unknown flow SDE schedule {schedule!r}; valid: {', '.join(FLOW_SCHEDULES)}")


def _cps_coefs(sigma: Tensor, sigma_next: Tensor, noise_level: float) -> StepCoefs:
    """Coefficient-preserving sampling (arXiv 2509.05952; Flow-GRPO's ``sde_type='cps'``).

    x' = (1 - sigma_next) x0_hat + c eps_hat + std z, std = sigma_next sin(a pi / 2),
    c = sqrt(sigma_next^2 - std^2): the noise coefficients keep c^2 + std^2 = sigma_next^2, as in the forward
    process. That gives the forward marginal at sigma_next only where x0_hat and eps_hat are exact: the std does
    not shrink with the step size, so this is no discretised SDE of the flow.
    """
    # 1. std and the noise coefficient of the mean (clamped against fp32 round-off below 0)
    std = sigma_next * math.sin(noise_level * math.pi / 2)
    c = torch.sqrt((sigma_next**2 - std**2).clamp(min=0))
    # 2. with x0_hat = x - sigma v and eps_hat = x + (1 - sigma) v, (1 - sigma_next) x0_hat + sigma_next eps_hat
    #    is the Euler step x + dt v, so mean = x + dt v + (c - sigma_next) eps_hat
    #    = (1 + c - sigma_next) x + (dt + (c - sigma_next)(1 - sigma)) v; at a = 0 (c = sigma_next exactly)
    #    that is 1 x + dt v, the Euler step bit for bit
    extra = c - sigma_next
    return StepCoefs.of(1 + extra, (sigma_next - sigma) + extra * (1 - sigma), std)


def flow_coefs(sigma: Tensor, sigma_next: Tensor, *, noise_level: float, schedule: str,
               sigma_range: tuple[float, float] | None = None) -> StepCoefs:
    """The step coefficients of a flow-matching SDE from fp32 ``sigma`` and ``sigma_next`` of any one shape
    (see ``flow_sde_step``)."""
    if schedule == "cps":
        return _cps_coefs(sigma, sigma_next, noise_level)
    g = _flow_g(schedule, noise_level, sigma, sigma_next, sigma_range)
    dt = sigma_next - sigma  # < 0
    # drift: v minus g^2/2 times the score, score = -(x + (1 - sigma) v) / sigma:
    # mean = x + dt (v + k (x + (1 - sigma) v)) with k = g^2 / (2 sigma) = (1 + dt k) x + dt (1 + k (1 - sigma)) v;
    # at g = 0 that is 1 x + dt v, the Euler step bit for bit
    k = g**2 / (2 * sigma)
    # diffusion over the step: s = g sqrt(-dt)
    return StepCoefs.of(1 + dt * k, dt * (1 + k * (1 - sigma)), g * torch.sqrt(-dt))


def ddim_coefs(alpha_prod_t: Tensor, alpha_prod_prev: Tensor, *, eta: float, prediction_type: str) -> StepCoefs:
    """The step coefficients of DDIM with eta from fp32 alphas of any one shape (see ``ddim_sde_step``)."""
    a_t, a_p = alpha_prod_t, alpha_prod_prev
    # 1. variance sigma_t(eta)^2 = eta^2 (1 - a_p) / (1 - a_t) (1 - a_t / a_p); the last factor as
    #    (a_p - a_t) / a_p: near the last step a_t / a_p rounds to about 1 in fp32 and 1 - it loses digits
    var = (1 - a_p) / (1 - a_t) * ((a_p - a_t) / a_p)
    std = eta * torch.sqrt(var)
    # 2. mean = sqrt(a_p) x0_hat + d eps_hat, d = sqrt(1 - a_p - std^2) (clamped against fp32 round-off)
    d = torch.sqrt((1 - a_p - std**2).clamp(min=0))
    r_t, r_p, s_t = torch.sqrt(a_t), torch.sqrt(a_p), torch.sqrt(1 - a_t)
    if prediction_type == "epsilon":
        # x0_hat = (x - s_t eps) / r_t, eps_hat = eps
        return StepCoefs.of(r_p / r_t, d - r_p * s_t / r_t, std)
    if prediction_type == "v_prediction":
        # x0_hat = r_t x - s_t v, eps_hat = r_t v + s_t x
        return StepCoefs.of(r_p * r_t + d * s_t, d * r_t - r_p * s_t, std)
    raise ValueError(f"unknown prediction_type {prediction_type!r}; valid: {', '.join(PREDICTION_TYPES)}")


def flow_sde_step(
    velocity: Tensor,
    sample: Tensor,
    sigma: float | Tensor,
    sigma_next: float | Tensor,
    *,
    noise_level: float,
    schedule: str = "flow_grpo",
    sigma_range: tuple[float, float] | None = None,
    prev_sample: Tensor | None = None,
    generator: torch.Generator | None = None,
    variance_noise: Tensor | None = None,
) -> SDEStep:
    """Stochastic step of a flow-matching model (x_sigma = (1 - sigma) x0 + sigma noise, v = noise - x0).

    ``schedule``: ``flow_grpo``, ``dance_grpo`` and ``linear`` (which needs ``sigma_range``, its schedule's
    (sigma_min, sigma_max)) are reverse SDEs with diffusion g(sigma) (the ODE's
    marginals, std = g sqrt(-dt)); ``cps`` is coefficient-preserving sampling (std = sigma_next sin(a pi / 2),
    a in [0, 1]; deterministic at sigma_next = 0). With ``noise_level=0`` each is exactly the Euler step
    x' = x + dt v (``FlowMatchEulerDiscreteScheduler.step``). Requires sigma > 0 and sigma_next <= sigma.

    ``log_prob`` is the exact Gaussian one for every schedule. Flow-GRPO's cps code returns -(x' - mean)^2
    averaged over dims instead (constants and 1/(2 std^2) dropped): not a log-density, and its log-ratios are
    these times 2 std^2, so its clip range means something else.
    """
    if schedule not in FLOW_SCHEDULES:
        raise ValueError(f"unknown flow SDE schedule {schedule!r}; valid: {', '.join(FLOW_SCHEDULES)}")
    sigma, sigma_next = _coef(sigma, sample), _coef(sigma_next, sample)  # [B, 1, 1, 1] or []
    c = flow_coefs(sigma, sigma_next, noise_level=noise_level, schedule=schedule, sigma_range=sigma_range)
    return gaussian_step(c, velocity, sample, prev_sample, generator, variance_noise)


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
    a_t, a_p = _coef(alpha_prod_t, sample), _coef(alpha_prod_prev, sample)  # [B, 1, 1, 1] or []
    c = ddim_coefs(a_t, a_p, eta=eta, prediction_type=prediction_type)
    return gaussian_step(c, model_output, sample, prev_sample, generator, variance_noise)


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
