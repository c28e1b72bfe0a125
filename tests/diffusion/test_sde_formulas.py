"""diffusion/sde.py against independent references: diffusers' DDIMScheduler at eta > 0, and the Flow-GRPO /
DanceGRPO flow-SDE formulas written out by hand, at several timesteps / sigmas.

Every expected value here comes from diffusers or from a formula spelled out in this file (computed in fp64
from the fp32 inputs), never from the functions under test. mmrl computes everything in fp32 (no fp64 inside),
so comparisons are to fp32 round-off (~1e-6 relative). The log-prob convention checked is the one documented
in sde.py: the elementwise Gaussian log-density *averaged* over all non-batch dims -> [B]; 0 where std == 0.
"""

import math

import pytest
import torch
from diffusers import DDIMScheduler

from diffusion.sde import ddim_sde_step, flow_sde_step

SHAPE = (2, 3, 4, 4)  # [B, C, H, W]


def _randn(seed, n=1, shape=SHAPE):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def _normal_lp(x, mean, std):
    """Independent log-prob: torch's Normal, averaged over the non-batch dims -> [B] (fp64)."""
    lp = torch.distributions.Normal(mean.double(), std.double()).log_prob(x.double())  # [B, ...]
    return lp.reshape(lp.shape[0], -1).mean(dim=1)


# ---------------------------------------------------------------------------------------------------------
# 1. DDIM with eta > 0 == diffusers.DDIMScheduler.step(..., eta=eta, variance_noise=z), every timestep
# ---------------------------------------------------------------------------------------------------------


def _sd_scheduler(prediction_type, set_alpha_to_one, n_steps=10):
    sched = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                          thresholding=False, set_alpha_to_one=set_alpha_to_one, prediction_type=prediction_type,
                          steps_offset=1)  # as SD 1.x: the last step is t = 1 -> final alpha
    sched.set_timesteps(n_steps)
    return sched


@pytest.mark.parametrize("eta", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
@pytest.mark.parametrize("set_alpha_to_one", [True, False])
def test_ddim_eta_matches_diffusers_at_every_timestep(eta, prediction_type, set_alpha_to_one):
    """DDIM step (DDIM eq. 12 with sigma_t(eta), eq. 16) == diffusers' DDIMScheduler.step with the same noise z,
    at every timestep of a 10-step schedule including the last one (to alpha 1 or to alphas_cumprod[0]).
    Also std == eta * sqrt(diffusers' _get_variance) and log_prob == Normal(prev - std z, std).log_prob(prev)
    averaged over non-batch dims (0 when std == 0: eta = 0, or the last step with set_alpha_to_one)."""
    sched = _sd_scheduler(prediction_type, set_alpha_to_one)
    alphas = sched.alphas_cumprod  # [1000] fp32, the schedule (input), not a reference value
    ratio = sched.config.num_train_timesteps // sched.num_inference_steps
    final_alpha = sched.final_alpha_cumprod.item()
    (x,) = _randn(10)
    for k, t in enumerate(sched.timesteps.tolist()):
        out, z = _randn(100 + k, 2)
        prev_t = t - ratio
        ref = sched.step(out, t, x, eta=eta, variance_noise=z).prev_sample  # [B, C, H, W]
        std_ref = eta * float(sched._get_variance(t, prev_t)) ** 0.5  # DDIM eq. 16, diffusers' variance

        a_p = alphas[prev_t].item() if prev_t >= 0 else final_alpha
        step = ddim_sde_step(out, x, alphas[t].item(), a_p, eta=eta, prediction_type=prediction_type,
                             variance_noise=z)
        torch.testing.assert_close(step.prev_sample, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(step.std, torch.full((SHAPE[0], 1, 1, 1), std_ref), rtol=1e-5, atol=1e-7)
        if std_ref > 0:
            expected_lp = _normal_lp(ref, ref - std_ref * z, torch.tensor(std_ref))  # [B]
            torch.testing.assert_close(step.log_prob.double(), expected_lp, rtol=1e-5, atol=1e-4)
            # scoring diffusers' own sample gives the same log-prob
            scored = ddim_sde_step(out, x, alphas[t].item(), a_p, eta=eta, prediction_type=prediction_type,
                                   prev_sample=ref)
            torch.testing.assert_close(scored.log_prob.double(), expected_lp, rtol=1e-5, atol=1e-4)
        else:  # point mass: sample is the mean, log-prob defined as 0
            assert torch.equal(step.log_prob, torch.zeros(SHAPE[0]))
            assert torch.equal(step.prev_sample, step.mean)
        x = ref


def test_ddim_std_keeps_fp32_accuracy_next_to_the_last_step():
    """sigma_t^2 = (1 - a_p) / (1 - a_t) * (a_p - a_t) / a_p against float64: with a_t and a_p both near 1
    (the last steps of SD's schedule) the textbook 1 - a_t / a_p loses about three digits in fp32."""
    x = torch.zeros(1, 1, 2, 2)
    for a_t, a_p in [(0.99991, 0.99995), (0.99965, 0.99983), (0.9991, 0.99915)]:
        a_t32, a_p32 = torch.tensor(a_t).item(), torch.tensor(a_p).item()     # the fp32 values as given
        step = ddim_sde_step(torch.zeros_like(x), x, a_t32, a_p32, eta=1.0)
        exact = ((1 - a_p32) / (1 - a_t32) * (a_p32 - a_t32) / a_p32) ** 0.5   # Python floats: float64
        assert abs(step.std.item() - exact) / exact < 2e-6, (a_t, a_p, step.std.item(), exact)


def test_ddim_eta_cases_are_really_stochastic():
    """Guard for the test above: at eta > 0 the step std is far from 0 at a middle timestep and the last step
    with set_alpha_to_one=False is still random (so the log-prob comparison actually ran there)."""
    sched = _sd_scheduler("epsilon", False)
    ratio = sched.config.num_train_timesteps // sched.num_inference_steps
    t_mid, t_last = sched.timesteps[5].item(), sched.timesteps[-1].item()
    assert float(sched._get_variance(t_mid, t_mid - ratio)) ** 0.5 > 0.1
    assert float(sched._get_variance(t_last, t_last - ratio)) > 0


# ---------------------------------------------------------------------------------------------------------
# 2. flow SDE steps == the papers' formulas, by hand, at several sigmas
# ---------------------------------------------------------------------------------------------------------

SIGMA_PAIRS = [(1.0, 0.9), (0.9, 0.8), (0.5, 0.4), (0.3, 0.05), (0.1, 0.0)]


def _flow_grpo_hand(v, x, sigma, sigma_next, a):
    """Flow-GRPO (Liu et al., arXiv 2505.05470) SDE step as written in its reference sampler:
        std_dev_t = a * sqrt(sigma / (1 - sigma'))  with sigma' = sigma_max (the next sigma) where sigma == 1
        mean = x (1 + std_dev_t^2 / (2 sigma) dt) + v (1 + std_dev_t^2 (1 - sigma) / (2 sigma)) dt
        std  = std_dev_t sqrt(-dt),   dt = sigma_next - sigma < 0
    fp64 from python floats."""
    x, v = x.double(), v.double()
    dt = sigma_next - sigma
    std_dev_t = a * math.sqrt(sigma / (1 - (sigma_next if sigma == 1 else sigma)))
    mean = x * (1 + std_dev_t**2 / (2 * sigma) * dt) + v * (1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    return mean, std_dev_t * math.sqrt(-dt)


def _dance_grpo_hand(v, x, sigma, sigma_next, eta):
    """DanceGRPO (Xue et al., arXiv 2505.07818) flow SDE step, in its own form (x0 and score, not the
    rearranged drift sde.py uses):
        x0_hat = x - sigma v,   score = -(x - (1 - sigma) x0_hat) / sigma^2
        mean   = x + dt v - (eta^2 / 2) score dt,   std = eta sqrt(-dt),   dt = sigma_next - sigma
    fp64 from python floats."""
    x, v = x.double(), v.double()
    dt = sigma_next - sigma
    x0_hat = x - sigma * v
    score = -(x - (1 - sigma) * x0_hat) / sigma**2
    mean = x + dt * v - 0.5 * eta**2 * score * dt
    return mean, eta * math.sqrt(-dt)


HAND = {"flow_grpo": _flow_grpo_hand, "dance_grpo": _dance_grpo_hand}


@pytest.mark.parametrize("schedule,level", [("flow_grpo", 0.7), ("flow_grpo", 1.0), ("dance_grpo", 0.3),
                                            ("dance_grpo", 1.0)])
@pytest.mark.parametrize("sigma,sigma_next", SIGMA_PAIRS)
def test_flow_sde_mean_std_log_prob_match_paper_formula(schedule, level, sigma, sigma_next):
    """mean, std, the drawn sample (x' = mean + std z for a given z) and its log-prob (Normal, averaged over
    non-batch dims) equal the hand formula; (1.0 -> 0.9) checks Flow-GRPO's sigma == 1 denominator."""
    v, x, z = _randn(20, 3)
    mean_ref, std_ref = HAND[schedule](v, x, sigma, sigma_next, level)
    step = flow_sde_step(v, x, sigma, sigma_next, noise_level=level, schedule=schedule, variance_noise=z)
    assert step.std.shape == (SHAPE[0], 1, 1, 1)
    torch.testing.assert_close(step.std.double(), torch.full((SHAPE[0], 1, 1, 1), std_ref, dtype=torch.float64),
                               rtol=2e-6, atol=0)
    torch.testing.assert_close(step.mean.double(), mean_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.prev_sample.double(), mean_ref + std_ref * z.double(), rtol=1e-5, atol=1e-5)
    lp_ref = _normal_lp(step.prev_sample, mean_ref, torch.tensor(std_ref))
    torch.testing.assert_close(step.log_prob.double(), lp_ref, rtol=1e-5, atol=1e-4)
    # scoring an arbitrary stored sample (not drawn from this step)
    (other,) = _randn(21)
    scored = flow_sde_step(v, x, sigma, sigma_next, noise_level=level, schedule=schedule, prev_sample=other)
    torch.testing.assert_close(scored.log_prob.double(), _normal_lp(other, mean_ref, torch.tensor(std_ref)),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("schedule", ["flow_grpo", "dance_grpo"])
def test_flow_sde_per_row_sigmas_match_formula(schedule):
    """[B] sigma tensors: each row follows the hand formula with its own (sigma, sigma_next), including a row
    at sigma == 1 next to a row at sigma < 1 (the Flow-GRPO denominator switch is elementwise)."""
    v, x, z = _randn(30, 3)
    sig, sig_next = [1.0, 0.5], [0.9, 0.4]
    step = flow_sde_step(v, x, torch.tensor(sig), torch.tensor(sig_next), noise_level=0.7, schedule=schedule,
                         variance_noise=z)
    for i in range(SHAPE[0]):
        mean_ref, std_ref = HAND[schedule](v[i:i + 1], x[i:i + 1], sig[i], sig_next[i], 0.7)
        torch.testing.assert_close(step.mean[i:i + 1].double(), mean_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(step.std[i].double().flatten(), torch.tensor([std_ref], dtype=torch.float64),
                                   rtol=2e-6, atol=0)
        lp_ref = _normal_lp(step.prev_sample[i:i + 1], mean_ref, torch.tensor(std_ref))
        torch.testing.assert_close(step.log_prob[i:i + 1].double(), lp_ref, rtol=1e-5, atol=1e-4)


def test_flow_grpo_and_dance_grpo_differ_where_expected():
    """The two schedules share the drift form but not g: with a = eta the Flow-GRPO std is
    a sqrt(sigma/(1-sigma)) sqrt(-dt) and DanceGRPO's is eta sqrt(-dt); at sigma = 0.5 they coincide (g = a),
    elsewhere they differ (guards against one schedule silently used for the other)."""
    v, x = _randn(40, 2)
    same = [flow_sde_step(v, x, 0.5, 0.4, noise_level=0.6, schedule=s) for s in ("flow_grpo", "dance_grpo")]
    torch.testing.assert_close(same[0].std, same[1].std)
    diff = [flow_sde_step(v, x, 0.8, 0.7, noise_level=0.6, schedule=s) for s in ("flow_grpo", "dance_grpo")]
    torch.testing.assert_close(diff[0].std / diff[1].std, torch.full((SHAPE[0], 1, 1, 1), 2.0))  # sqrt(.8/.2)


# ---------------------------------------------------------------------------------------------------------
# 3. deterministic steps (noise 0, as outside the SDE window): exactly the Euler step x + v dt
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["flow_grpo", "dance_grpo", "cps"])
@pytest.mark.parametrize("sigma,sigma_next", SIGMA_PAIRS + [(1.0, 0.0)])
def test_zero_noise_flow_step_is_exactly_euler(schedule, sigma, sigma_next):
    """noise_level = 0 (ODE steps, e.g. outside a MixGRPO window): prev_sample == mean == x + v dt bit for bit
    (dt in fp32 as sigma_next - sigma), std == 0, and log_prob == 0 sampled or scored."""
    v, x, other = _randn(50, 3)
    dt = torch.tensor(sigma_next, dtype=torch.float32) - torch.tensor(sigma, dtype=torch.float32)
    euler = x + dt * v
    step = flow_sde_step(v, x, sigma, sigma_next, noise_level=0.0, schedule=schedule,
                         generator=torch.Generator().manual_seed(0))
    assert torch.equal(step.prev_sample, euler) and torch.equal(step.mean, euler)
    assert torch.equal(step.std, torch.zeros(SHAPE[0], 1, 1, 1))
    assert torch.equal(step.log_prob, torch.zeros(SHAPE[0]))
    scored = flow_sde_step(v, x, sigma, sigma_next, noise_level=0.0, schedule=schedule, prev_sample=other)
    assert torch.equal(scored.log_prob, torch.zeros(SHAPE[0])) and torch.equal(scored.mean, euler)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction"])
def test_zero_eta_ddim_is_the_deterministic_ddim_formula(prediction_type):
    """eta = 0: prev = sqrt(a_prev) x0_hat + sqrt(1 - a_prev) eps_hat (DDIM eq. 12 with sigma_t = 0), by hand
    in fp64, for epsilon (x0 = (x - sqrt(1-a) eps)/sqrt(a)) and v (x0 = sqrt(a) x - sqrt(1-a) v,
    eps = sqrt(a) v + sqrt(1-a) x) outputs; log_prob 0."""
    out, x = _randn(60, 2)
    a_t, a_p = 0.3, 0.6
    xd, od = x.double(), out.double()
    if prediction_type == "epsilon":
        eps, x0 = od, (xd - math.sqrt(1 - a_t) * od) / math.sqrt(a_t)
    else:
        x0, eps = math.sqrt(a_t) * xd - math.sqrt(1 - a_t) * od, math.sqrt(a_t) * od + math.sqrt(1 - a_t) * xd
    expected = math.sqrt(a_p) * x0 + math.sqrt(1 - a_p) * eps
    step = ddim_sde_step(out, x, a_t, a_p, eta=0.0, prediction_type=prediction_type)
    torch.testing.assert_close(step.prev_sample.double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(step.prev_sample, step.mean) and torch.equal(step.log_prob, torch.zeros(SHAPE[0]))


# ---------------------------------------------------------------------------------------------------------
# 4. the linear noise of Flow-GRPO's Wan trainer: g = a (sigma_min + (sigma_max - sigma_min) sigma)
# ---------------------------------------------------------------------------------------------------------


def _linear_hand(v, x, sigma, sigma_next, level, lo, hi):
    """Flow-GRPO's Wan SDE step as its code writes it (fp64): std_dev_t = lo + (hi - lo) sigma (times a),
    mean = x (1 + std_dev_t^2 / (2 sigma) dt) + v (1 + std_dev_t^2 (1 - sigma) / (2 sigma)) dt,
    std = std_dev_t sqrt(-dt)."""
    x, v = x.double(), v.double()
    dt = sigma_next - sigma
    g = level * (lo + (hi - lo) * sigma)
    mean = x * (1 + g**2 / (2 * sigma) * dt) + v * (1 + g**2 * (1 - sigma) / (2 * sigma)) * dt
    return mean, g * math.sqrt(-dt)


@pytest.mark.parametrize("level", [1.0, 0.5])
@pytest.mark.parametrize("sigma,sigma_next", [(0.999999, 0.9828), (0.8, 0.6), (0.3, 0.0)])
def test_linear_sde_matches_flow_grpo_wan_formula(level, sigma, sigma_next):
    """mean, std, sample and log-prob of the linear schedule equal the hand formula, also at UniPC's first sigma
    (1 - 1e-6), where it stays finite; (sigma_min, sigma_max) = (0, 0.9828), a Wan schedule's last and second."""
    v, x, z = _randn(70, 3)
    lo, hi = 0.0, 0.9828
    mean_ref, std_ref = _linear_hand(v, x, sigma, sigma_next, level, lo, hi)
    step = flow_sde_step(v, x, sigma, sigma_next, noise_level=level, schedule="linear", sigma_range=(lo, hi),
                         variance_noise=z)
    torch.testing.assert_close(step.std.double(), torch.full((SHAPE[0], 1, 1, 1), std_ref, dtype=torch.float64),
                               rtol=2e-6, atol=0)
    torch.testing.assert_close(step.mean.double(), mean_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.log_prob.double(), _normal_lp(step.prev_sample, mean_ref, torch.tensor(std_ref)),
                               rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="sigma_range"):
        flow_sde_step(v, x, sigma, sigma_next, noise_level=level, schedule="linear")
