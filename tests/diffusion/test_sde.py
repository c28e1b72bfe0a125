"""Contracts of diffusion/sde.py: scheduler parity, log-prob convention, sample/score consistency, toy SDE."""

import math

import pytest
import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

from diffusion.sde import SDEStep, ddim_sde_step, flow_sde_step, gaussian_kl

SHAPE = (3, 4, 5, 6)  # [B, C, H, W]
SCHEDULES = ["flow_grpo", "dance_grpo", "cps"]
PREDICTION_TYPES = ["epsilon", "v_prediction"]


def _normal_log_prob(step: SDEStep) -> torch.Tensor:
    lp = torch.distributions.Normal(step.mean.float(), step.std).log_prob(step.prev_sample.float())  # [B, C, H, W]
    return lp.mean(dim=(1, 2, 3))  # [B]


def _flow(schedule, noise_level, **kw):
    g = torch.Generator().manual_seed(0)
    v, x = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    return flow_sde_step(v, x, 0.8, 0.6, noise_level=noise_level, schedule=schedule, **kw), (v, x)


def _ddim(prediction_type, eta, **kw):
    g = torch.Generator().manual_seed(0)
    out, x = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    return ddim_sde_step(out, x, 0.3, 0.5, eta=eta, prediction_type=prediction_type, **kw), (out, x)


# 1. zero-noise flow step == FlowMatchEulerDiscreteScheduler.step
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_flow_zero_noise_matches_euler_scheduler(schedule):
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(6)
    sigmas = scheduler.sigmas.clone()  # [7], plain tensor indexed by integer step
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SHAPE, generator=g)
    for i, t in enumerate(scheduler.timesteps):
        v = torch.randn(SHAPE, generator=g)
        ref = scheduler.step(v, t, x).prev_sample
        out = flow_sde_step(v, x, sigmas[i].item(), sigmas[i + 1].item(), noise_level=0.0, schedule=schedule)
        torch.testing.assert_close(out.prev_sample, ref, rtol=0, atol=1e-6)
        assert torch.equal(out.prev_sample, out.mean)
        assert torch.equal(out.log_prob, torch.zeros(SHAPE[0])) and torch.equal(out.std, torch.zeros(SHAPE[0], 1, 1, 1))
        x = ref


def test_deterministic_step_scores_zero():
    """Convention: std == 0 is a point mass; log_prob is 0 (sampled or scored), never NaN."""
    out, _ = _flow("flow_grpo", 0.0, prev_sample=torch.randn(SHAPE))
    assert torch.equal(out.log_prob, torch.zeros(SHAPE[0]))
    out, _ = _ddim("epsilon", 0.0)
    assert torch.equal(out.log_prob, torch.zeros(SHAPE[0])) and torch.equal(out.prev_sample, out.mean)
    v = torch.randn(SHAPE, requires_grad=True)  # no NaN gradients through the deterministic branch
    flow_sde_step(v, torch.randn(SHAPE), 1.0, 0.9, noise_level=0.0).log_prob.sum().backward()
    assert torch.equal(v.grad, torch.zeros(SHAPE))


# 2. eta=0 DDIM step == DDIMScheduler.step(eta=0)
@pytest.mark.parametrize("prediction_type", PREDICTION_TYPES)
@pytest.mark.parametrize("set_alpha_to_one", [True, False])
def test_ddim_eta0_matches_scheduler(prediction_type, set_alpha_to_one):
    scheduler = DDIMScheduler(
        beta_schedule="scaled_linear",
        clip_sample=False,
        thresholding=False,
        set_alpha_to_one=set_alpha_to_one,
        prediction_type=prediction_type,
    )
    scheduler.set_timesteps(5)
    alphas = scheduler.alphas_cumprod.clone()  # [1000]
    final_alpha = 1.0 if set_alpha_to_one else alphas[0].item()
    ratio = scheduler.config.num_train_timesteps // scheduler.num_inference_steps
    g = torch.Generator().manual_seed(2)
    x = torch.randn(SHAPE, generator=g)
    for t in scheduler.timesteps.tolist():
        out = torch.randn(SHAPE, generator=g)
        ref = scheduler.step(out, t, x, eta=0.0).prev_sample
        a_p = alphas[t - ratio].item() if t - ratio >= 0 else final_alpha
        step = ddim_sde_step(out, x, alphas[t].item(), a_p, eta=0.0, prediction_type=prediction_type)
        torch.testing.assert_close(step.prev_sample, ref, rtol=1e-5, atol=1e-5)
        x = ref


# 3. log_prob == Normal(mean, std).log_prob(prev_sample).mean(non-batch dims), sampled and scored
@pytest.mark.parametrize("scored", [False, True])
@pytest.mark.parametrize("case", SCHEDULES + PREDICTION_TYPES)
def test_log_prob_matches_torch_normal(case, scored):
    kw = {"prev_sample": torch.randn(SHAPE) * 0.5} if scored else {"generator": torch.Generator().manual_seed(3)}
    out = _flow(case, 0.7, **kw)[0] if case in SCHEDULES else _ddim(case, 1.0, **kw)[0]
    assert out.log_prob.shape == (SHAPE[0],) and out.std.shape == (SHAPE[0], 1, 1, 1)
    assert bool((out.std > 0).all())
    torch.testing.assert_close(out.log_prob, _normal_log_prob(out))
    if scored:
        assert torch.equal(out.prev_sample, kw["prev_sample"])


# 4. re-scoring a drawn sample reproduces log_prob and mean (fp32 and bf16 inputs)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", SCHEDULES + PREDICTION_TYPES)
def test_score_own_sample_is_consistent(case, dtype):
    g = torch.Generator().manual_seed(4)
    out, x = torch.randn(SHAPE, generator=g).to(dtype), torch.randn(SHAPE, generator=g).to(dtype)
    if case in SCHEDULES:
        step = lambda **kw: flow_sde_step(out, x, 1.0, 0.9, noise_level=0.7, schedule=case, **kw)  # noqa: E731
    else:
        step = lambda **kw: ddim_sde_step(out, x, 0.2, 0.4, eta=1.0, prediction_type=case, **kw)  # noqa: E731
    drawn = step(generator=torch.Generator().manual_seed(5))
    again = step(prev_sample=drawn.prev_sample)
    assert torch.equal(again.log_prob, drawn.log_prob) and torch.equal(again.mean, drawn.mean)
    assert torch.isfinite(drawn.log_prob).all()
    # same generator seed -> same draw (pure function)
    assert torch.equal(step(generator=torch.Generator().manual_seed(5)).prev_sample, drawn.prev_sample)


# 5. [B] tensor coefficients give per-row results equal to scalar calls
@pytest.mark.parametrize("case", SCHEDULES + PREDICTION_TYPES)
def test_batched_coefficients_match_scalar_calls(case):
    g = torch.Generator().manual_seed(6)
    out, x = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    if case in SCHEDULES:  # row 0 has sigma == 1 (flow_grpo uses sigma_next in the denominator there), row 2
        # steps to sigma 0 (std 0 for cps)
        c, c_next = torch.tensor([1.0, 0.7, 0.3]), torch.tensor([0.9, 0.5, 0.0])
        step = lambda o, s, a, b, **kw: flow_sde_step(o, s, a, b, noise_level=0.7, schedule=case, **kw)  # noqa: E731
    else:  # row 2 steps to alpha 1 (std 0)
        c, c_next = torch.tensor([0.1, 0.5, 0.9]), torch.tensor([0.3, 0.8, 1.0])
        step = lambda o, s, a, b, **kw: ddim_sde_step(o, s, a, b, eta=1.0, prediction_type=case, **kw)  # noqa: E731
    batched = step(out, x, c, c_next, generator=g)
    for i in range(SHAPE[0]):
        rows = slice(i, i + 1)
        row = step(out[rows], x[rows], c[i].item(), c_next[i].item(), prev_sample=batched.prev_sample[rows])
        torch.testing.assert_close(row.mean, batched.mean[rows], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(row.std, batched.std[rows], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(row.log_prob, batched.log_prob[rows], rtol=1e-6, atol=1e-6)
    assert torch.isfinite(batched.log_prob).all()


# 6. Gaussian toy: the SDEs keep the flow's marginals and land on the data distribution
M, S0 = 1.0, 0.5  # data x0 ~ N(M, S0^2)


def _exact_velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """E[noise - x0 | x_sigma = x] for x0 ~ N(M, S0^2), noise ~ N(0, 1), x_sigma = (1 - sigma) x0 + sigma noise.

    (v, x_sigma) is jointly Gaussian: E v = -M, E x = (1 - sigma) M, Var x = (1 - sigma)^2 S0^2 + sigma^2,
    Cov(v, x) = sigma - (1 - sigma) S0^2, so v(x) = E v + Cov / Var * (x - E x).
    """
    var = (1 - sigma) ** 2 * S0**2 + sigma**2
    return -M + (sigma - (1 - sigma) * S0**2) / var * (x - (1 - sigma) * M)


def _integrate(schedule: str, noise_level: float, n_samples: int, n_steps: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n_samples, 1, generator=g)  # [N, 1], x at sigma = 1 is pure noise
    sigmas = torch.linspace(1.0, 0.0, n_steps + 1, dtype=torch.float64).tolist()
    for i in range(n_steps):
        level = noise_level if i < n_steps - 1 else 0.0  # last step (to sigma = 0) as ODE
        s, s_next = sigmas[i], sigmas[i + 1]
        v = _exact_velocity(x, s)  # [N, 1]
        x = flow_sde_step(v, x, s, s_next, noise_level=level, schedule=schedule, generator=g).prev_sample  # [N, 1]
    return x[:, 0]  # [N]


@pytest.mark.parametrize("schedule,noise_level", [("flow_grpo", 0.7), ("dance_grpo", 0.3)])  # cps: test_cps.py
def test_gaussian_toy_sde_reaches_data_distribution(schedule, noise_level):
    n, steps = 100_000, 200
    x_sde, x_ode = _integrate(schedule, noise_level, n, steps), _integrate(schedule, 0.0, n, steps)
    # Sampling error: se(mean) = S0 / sqrt(n) ~ 1.6e-3, se(var) = S0^2 sqrt(2 / n) ~ 1.1e-3; allow 5 se.
    # Discretisation (exact moment propagation of this linear scheme, 200 uniform steps): the mean is exact,
    # the variance is off by 3.7e-3 (ODE), 3.1e-3 (dance_grpo), 1.0e-3 (flow_grpo); allow 5e-3.
    # A drift with g^2/sigma or g^2/(4 sigma) instead of g^2/(2 sigma) misses the variance by >= 3e-2.
    tol_mean, tol_var = 5 * S0 / math.sqrt(n), 5 * S0**2 * math.sqrt(2 / n) + 5e-3
    for x in (x_sde, x_ode):
        assert abs(x.mean().item() - M) < tol_mean
        assert abs(x.var().item() - S0**2) < tol_var
    assert abs(x_sde.var().item() - x_ode.var().item()) < tol_var


# 7. gaussian_kl and dtypes
def test_gaussian_kl():
    mean = torch.randn(2, 3, 4)
    std = torch.tensor([0.5, 2.0]).view(2, 1, 1)
    assert torch.equal(gaussian_kl(mean, mean, std), torch.zeros(2))
    a = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    b = torch.tensor([[0.0, 0.0], [3.0, 0.0]])
    kl = gaussian_kl(a, b, torch.tensor([[0.5], [1.0]]))
    expected = torch.tensor([(1 / (2 * 0.25) + 4 / (2 * 0.25)) / 2, (9 / 2 + 0) / 2])  # hand formula, dim-mean
    torch.testing.assert_close(kl, expected)
    # agrees with torch's KL of the per-element Gaussians averaged over dims
    p, q = torch.distributions.Normal(a, 0.7), torch.distributions.Normal(b, 0.7)
    torch.testing.assert_close(gaussian_kl(a, b, torch.tensor(0.7)), torch.distributions.kl_divergence(p, q).mean(1))
    # a deterministic row (std 0) has KL 0 even where the means differ, next to a random row
    kl = gaussian_kl(a, b, torch.tensor([[0.0], [1.0]]))
    assert torch.equal(kl, torch.tensor([0.0, 9 / 4]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    g = torch.Generator().manual_seed(8)
    out, x = torch.randn(SHAPE, generator=g).to(dtype), torch.randn(SHAPE, generator=g).to(dtype)
    for step in (
        flow_sde_step(out, x, 0.8, 0.6, noise_level=0.7, generator=g),
        ddim_sde_step(out, x, 0.3, 0.5, eta=1.0, generator=g),
    ):
        assert step.prev_sample.dtype == dtype and step.mean.dtype == dtype
        assert step.log_prob.dtype == torch.float32 and step.std.dtype == torch.float32
        assert torch.isfinite(step.log_prob).all()


# 8. unknown names are errors that list the valid ones
def test_unknown_names_raise():
    x = torch.zeros(SHAPE)
    with pytest.raises(ValueError, match="flow_grpo, dance_grpo"):
        flow_sde_step(x, x, 0.5, 0.4, noise_level=0.7, schedule="ddpm")
    with pytest.raises(ValueError, match="epsilon, v_prediction"):
        ddim_sde_step(x, x, 0.3, 0.5, eta=1.0, prediction_type="sample")
    with pytest.raises(ValueError, match=r"\[B\] tensors with B=3, got shape \(2,\)"):
        flow_sde_step(x, x, torch.ones(2), 0.4, noise_level=0.7)


def test_step_math_is_fp32_whatever_the_coefficients_and_default_dtype():
    """fp64 [B] coefficients do not promote the step (std and log-prob stay fp32, equal to fp32 ones), and a
    draw does not depend on torch's default dtype (z is drawn in fp32 from the generator)."""
    g = torch.Generator().manual_seed(3)
    v, x = torch.randn(SHAPE, generator=g), torch.randn(SHAPE, generator=g)
    sig, nxt = torch.tensor([0.9, 0.5, 0.3]), torch.tensor([0.8, 0.4, 0.1])
    ref = flow_sde_step(v, x, sig, nxt, noise_level=0.7, generator=torch.Generator().manual_seed(1))
    wide = flow_sde_step(v, x, sig.double(), nxt.double(), noise_level=0.7, generator=torch.Generator().manual_seed(1))
    assert wide.std.dtype == wide.log_prob.dtype == torch.float32
    assert torch.equal(wide.prev_sample, ref.prev_sample) and torch.equal(wide.log_prob, ref.log_prob)
    d = ddim_sde_step(v, x, torch.tensor([0.3, 0.4, 0.5]).double(), torch.tensor([0.5, 0.6, 0.7]).double(), eta=1.0)
    assert d.std.dtype == d.log_prob.dtype == torch.float32
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        again = flow_sde_step(v, x, sig, nxt, noise_level=0.7, generator=torch.Generator().manual_seed(1))
    finally:
        torch.set_default_dtype(default)
    assert torch.equal(again.prev_sample, ref.prev_sample) and torch.equal(again.log_prob, ref.log_prob)


def test_variance_noise_is_used_instead_of_the_generator():
    x, v = torch.randn(2, 1, 2, 2), torch.randn(2, 1, 2, 2)
    z = torch.randn(2, 1, 2, 2, generator=torch.Generator().manual_seed(5))
    drawn = flow_sde_step(v, x, 0.8, 0.6, noise_level=0.7, generator=torch.Generator().manual_seed(5))
    given = flow_sde_step(v, x, 0.8, 0.6, noise_level=0.7, variance_noise=z)
    assert torch.equal(drawn.prev_sample, given.prev_sample) and torch.equal(drawn.log_prob, given.log_prob)
    torch.testing.assert_close(given.prev_sample, given.mean + given.std * z)
    d = ddim_sde_step(v, x, 0.5, 0.7, eta=1.0, variance_noise=z)
    torch.testing.assert_close(d.prev_sample, d.mean + d.std * z)
