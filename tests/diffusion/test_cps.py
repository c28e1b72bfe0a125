"""Coefficient-preserving sampling (CPS; arXiv 2509.05952, Flow-GRPO's ``sde_type='cps'``) as
``flow_sde_step(..., schedule="cps")`` and as ``policy.sde_schedule: cps``.

Flow-GRPO's step, written out here from its sampler (``sde_step_with_logprob``, the cps branch):
    std_dev_t = sigma_prev sin(a pi / 2)
    x0_hat    = x - sigma v,   eps_hat = x + (1 - sigma) v
    mean      = x0_hat (1 - sigma_prev) + eps_hat sqrt(sigma_prev^2 - std_dev_t^2)
    x'        = mean + std_dev_t z
Its "log-prob" is -(x' - mean)^2 averaged over dims (no constants, no 1/(2 std^2)); mmrl's is the exact
Gaussian log N(x'; mean, std^2) averaged over dims. Expected values come from that formula in fp64, from
numbers worked by hand below, or from torch.distributions, never from the function under test.
"""

import json
import math
import os

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from diffusion.sde import flow_sde_step, gaussian_kl
from mmrl.config import ConfigError, load_config

SHAPE = (2, 3, 4, 4)  # [B, C, H, W]


def _randn(seed, n=1, shape=SHAPE):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def _flow_grpo_cps(v, x, sigma, sigma_prev, a):
    """Flow-GRPO's cps step in its own form, fp64 from python floats -> (mean, std)."""
    x, v = x.double(), v.double()
    std_dev_t = sigma_prev * math.sin(a * math.pi / 2)
    x0_hat = x - sigma * v
    eps_hat = x + v * (1 - sigma)
    mean = x0_hat * (1 - sigma_prev) + eps_hat * math.sqrt(sigma_prev**2 - std_dev_t**2)
    return mean, std_dev_t


def _normal_lp(x, mean, std):
    """torch's Normal log-density averaged over the non-batch dims -> [B] (fp64)."""
    lp = torch.distributions.Normal(mean.double(), torch.as_tensor(std).double()).log_prob(x.double())
    return lp.reshape(lp.shape[0], -1).mean(dim=1)


# ---------------------------------------------------------------------------------------------------------
# 1. the step against numbers worked by hand and against Flow-GRPO's formula
# ---------------------------------------------------------------------------------------------------------

# (sigma, sigma_prev, a, x, v, z) -> (std, mean, x', exact log-prob of x'); one row per case, worked by hand:
#  A: sin(pi/6) = 1/2: std = .3, c = sqrt(.36 - .09) = .5196152423; x0_hat = .5 + .8 = 1.3,
#     eps_hat = .5 - .2 = .3; mean = 1.3 * .4 + .3 c = .6758845727; x' = mean + .3 * .3;
#     log-prob = -(.09 / .3)^2 / 2 - log(.3) - log(2 pi) / 2 = .2400342711
#  B: sigma = 1, sin(pi/4): std = c = .75 / sqrt(2) = .5303300859; x0_hat = -1.2 - .4 = -1.6, eps_hat = x = -1.2;
#     mean = -1.6 * .25 - 1.2 c = -1.0363961031; x' = mean - .7 std;
#     log-prob = -.49 / 2 - log(std) - log(2 pi) / 2 = -.5296828705
#  C: a = 1: std = sigma_prev = .4, c = 0; mean = (2 - .5) * .6 = .9; x' = .9 - .4;
#     log-prob = -1 / 2 - log(.4) - log(2 pi) / 2 = -.5026478013
HAND = [
    ((0.8, 0.6, 1 / 3, 0.5, -1.0, 0.3), (0.3, 0.6758845727, 0.7658845727, 0.2400342711)),
    ((1.0, 0.75, 0.5, -1.2, 0.4, -0.7), (0.5303300859, -1.0363961031, -1.4076271632, -0.5296828705)),
    ((0.5, 0.4, 1.0, 2.0, 1.0, -1.0), (0.4, 0.9, 0.5, -0.5026478013)),
]


@pytest.mark.parametrize("case,expected", HAND)
def test_cps_step_matches_hand_numbers(case, expected):
    sigma, sigma_prev, a, x0, v0, z0 = case
    std, mean, prev, lp = expected
    x, v, z = (torch.full(SHAPE, t) for t in (x0, v0, z0))
    step = flow_sde_step(v, x, sigma, sigma_prev, noise_level=a, schedule="cps", variance_noise=z)
    torch.testing.assert_close(step.std, torch.full((SHAPE[0], 1, 1, 1), std), rtol=1e-6, atol=0)
    torch.testing.assert_close(step.mean, torch.full(SHAPE, mean), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(step.prev_sample, torch.full(SHAPE, prev), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(step.log_prob, torch.full((SHAPE[0],), lp), rtol=1e-5, atol=1e-5)
    # the fp64 transcription of Flow-GRPO's formula gives the same numbers (it is what the other tests use)
    mean_fg, std_fg = _flow_grpo_cps(torch.full(SHAPE, v0, dtype=torch.float64),
                                     torch.full(SHAPE, x0, dtype=torch.float64), sigma, sigma_prev, a)
    assert std_fg == pytest.approx(std, rel=1e-9)
    torch.testing.assert_close(mean_fg, torch.full(SHAPE, mean, dtype=torch.float64), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("a", [0.3, 0.8, 1.0])
@pytest.mark.parametrize("sigma,sigma_prev", [(1.0, 0.9), (0.9, 0.8), (0.5, 0.4), (0.3, 0.05)])
def test_cps_step_matches_flow_grpo_formula(sigma, sigma_prev, a):
    """Random x, v, z and per-row [B] sigmas (row 1 one step further along): mean, std, sample."""
    v, x, z = _randn(1, 3)
    sig, prev = torch.tensor([sigma, sigma * 0.5]), torch.tensor([sigma_prev, sigma_prev * 0.5])
    step = flow_sde_step(v, x, sig, prev, noise_level=a, schedule="cps", variance_noise=z)
    for i in range(SHAPE[0]):
        mean_fg, std_fg = _flow_grpo_cps(v[i:i + 1], x[i:i + 1], sig[i].item(), prev[i].item(), a)
        assert step.std[i].item() == pytest.approx(std_fg, rel=2e-6)
        torch.testing.assert_close(step.mean[i:i + 1].double(), mean_fg, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(step.prev_sample[i:i + 1].double(), mean_fg + std_fg * z[i:i + 1].double(),
                                   rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# 2-3. the exact log-prob, re-scoring, and how it relates to Flow-GRPO's "log-prob"
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scored", [False, True])
def test_cps_log_prob_is_the_exact_normal_log_density(scored):
    v, x, other = _randn(2, 3)
    kw = {"prev_sample": other} if scored else {"generator": torch.Generator().manual_seed(3)}
    step = flow_sde_step(v, x, 0.7, 0.5, noise_level=0.8, schedule="cps", **kw)
    assert step.log_prob.shape == (SHAPE[0],) and bool((step.std > 0).all())
    expected = torch.distributions.Normal(step.mean, step.std).log_prob(step.prev_sample).mean(dim=(1, 2, 3))
    torch.testing.assert_close(step.log_prob, expected)
    mean_fg, std_fg = _flow_grpo_cps(v, x, 0.7, 0.5, 0.8)  # independent of the step's own mean and std
    torch.testing.assert_close(step.log_prob.double(), _normal_lp(step.prev_sample, mean_fg, std_fg),
                               rtol=1e-5, atol=1e-4)


def test_flow_grpo_cps_log_prob_is_not_a_log_density():
    """Scoring one x' under two velocities: the exact log-ratio is Flow-GRPO's difference divided by 2 std^2
    (its -(x' - mean)^2 drops that factor), so with std = .5 * sin(.4 pi) ~ .48 its ratios are ~2x too steep."""
    v1, v2, x, prev = _randn(4, 4)
    v2 = v1 + 0.05 * v2
    s1, s2 = (flow_sde_step(v, x, 0.7, 0.5, noise_level=0.8, schedule="cps", prev_sample=prev) for v in (v1, v2))
    fg = [-((prev.double() - _flow_grpo_cps(v, x, 0.7, 0.5, 0.8)[0]) ** 2).mean(dim=(1, 2, 3)) for v in (v1, v2)]
    std = 0.5 * math.sin(0.8 * math.pi / 2)
    exact = (s1.log_prob - s2.log_prob).double()  # [B]
    torch.testing.assert_close(exact, (fg[0] - fg[1]) / (2 * std**2), rtol=1e-4, atol=1e-6)
    assert bool(((fg[0] - fg[1]) - exact).abs().min() > 1e-4)  # the two conventions really differ here


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scoring_the_stored_sample_reproduces_its_log_prob(dtype):
    """Sample, store x', re-score it: log_prob and mean bit for bit (ratio exactly 1), fp32 and bf16 inputs."""
    v, x = (t.to(dtype) for t in _randn(5, 2))
    sig, prev = torch.tensor([1.0, 0.6]), torch.tensor([0.8, 0.3])
    drawn = flow_sde_step(v, x, sig, prev, noise_level=0.8, schedule="cps", generator=torch.Generator().manual_seed(6))
    again = flow_sde_step(v, x, sig, prev, noise_level=0.8, schedule="cps", prev_sample=drawn.prev_sample)
    assert drawn.prev_sample.dtype == dtype and torch.isfinite(drawn.log_prob).all()
    assert torch.equal(again.log_prob, drawn.log_prob) and torch.equal(again.mean, drawn.mean)
    assert torch.equal(torch.exp(again.log_prob - drawn.log_prob), torch.ones(SHAPE[0]))


# ---------------------------------------------------------------------------------------------------------
# 4-5. deterministic limits: a = 0 is the Euler step, the last step (sigma_prev = 0) is a point mass
# ---------------------------------------------------------------------------------------------------------


def test_zero_noise_cps_is_the_euler_step():
    """a = 0: std = 0, c = sigma_prev, and
        x0_hat (1 - s') + eps_hat s' = (x - s v)(1 - s') + (x + (1 - s) v) s'
                                     = x - s v - s' x + s s' v + s' x + s' v - s s' v = x + (s' - s) v,
    the Euler step: equal to x + dt v bit for bit at every step of a shifted 10-step schedule (and to
    diffusers' FlowMatchEulerDiscreteScheduler.step), with log_prob 0."""
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    sigmas = scheduler.sigmas.clone()  # [11] fp32, sigmas[10] = 0
    (x,) = _randn(7)
    for i, t in enumerate(scheduler.timesteps):
        v, other = _randn(100 + i, 2)
        s, s_next = sigmas[i].item(), sigmas[i + 1].item()
        euler = x + (torch.tensor(s_next) - torch.tensor(s)) * v
        step = flow_sde_step(v, x, s, s_next, noise_level=0.0, schedule="cps", generator=torch.Generator())
        assert torch.equal(step.prev_sample, euler) and torch.equal(step.mean, euler), i
        assert torch.equal(step.std, torch.zeros(SHAPE[0], 1, 1, 1)) and torch.equal(step.log_prob, torch.zeros(2))
        torch.testing.assert_close(step.prev_sample, scheduler.step(v, t, x).prev_sample, rtol=0, atol=1e-6)
        mean_fg, _ = _flow_grpo_cps(v, x, s, s_next, 0.0)  # Flow-GRPO's form, fp64: the same step
        torch.testing.assert_close(mean_fg, euler.double(), rtol=1e-5, atol=1e-5)
        scored = flow_sde_step(v, x, s, s_next, noise_level=0.0, schedule="cps", prev_sample=other)
        assert torch.equal(scored.log_prob, torch.zeros(SHAPE[0]))
        x = euler


@pytest.mark.parametrize("a", [0.5, 0.8, 1.0])
def test_last_step_is_deterministic(a):
    """sigma_prev = 0: std = 0 and mean = x0_hat = x - sigma v (the Euler step to 0): the sample is the mean,
    log_prob is 0 sampled or scored, the KL is 0, and no NaN reaches the gradient; a row with sigma_prev > 0
    next to it stays random."""
    v, x, other = _randn(8, 3)
    v.requires_grad_(True)
    step = flow_sde_step(v, x, torch.tensor([0.2, 0.5]), torch.tensor([0.0, 0.3]), noise_level=a, schedule="cps",
                         generator=torch.Generator().manual_seed(0))
    assert step.std[0].item() == 0.0 and step.std[1].item() > 0
    assert torch.equal(step.prev_sample[0], step.mean[0]) and step.log_prob[0].item() == 0.0
    torch.testing.assert_close(step.mean[0], (x - 0.2 * v)[0], rtol=0, atol=1e-6)
    assert not torch.equal(step.prev_sample[1], step.mean[1]) and step.log_prob[1].item() != 0.0
    scored = flow_sde_step(v, x, torch.tensor([0.2, 0.5]), torch.tensor([0.0, 0.3]), noise_level=a, schedule="cps",
                           prev_sample=other)
    assert scored.log_prob[0].item() == 0.0 and scored.log_prob[1].item() != 0.0
    kl = gaussian_kl(scored.mean, scored.mean + 1, scored.std)
    assert kl[0].item() == 0.0 and kl[1].item() > 0
    scored.log_prob.sum().backward()  # the point-mass row: zero gradient, not NaN
    assert torch.isfinite(v.grad).all() and torch.equal(v.grad[0], torch.zeros_like(v.grad[0]))
    assert bool(v.grad[1].abs().sum() > 0)


# ---------------------------------------------------------------------------------------------------------
# 6. the coefficients are preserved; 7. the exact KL applies unchanged
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("a", [0.3, 0.8, 1.0])
@pytest.mark.parametrize("sigma,sigma_prev", [(1.0, 0.9), (0.7, 0.5), (0.3, 0.05)])
def test_cps_preserves_the_noise_coefficients(sigma, sigma_prev, a):
    """With the true velocity of a point mass x0 (x = (1 - s) x0 + s eps, v = eps - x0), x0_hat = x0 and
    eps_hat = eps, and x' = (1 - s') x0 + sqrt(s'^2 - std^2) eps + std z: the forward process at s' (noise
    coefficients with c^2 + std^2 = s'^2). The flow_grpo SDE step at the same a does not keep that."""
    x0, eps, z = _randn(9, 3)
    x, v = (1 - sigma) * x0 + sigma * eps, eps - x0
    step = flow_sde_step(v, x, sigma, sigma_prev, noise_level=a, schedule="cps", variance_noise=z)
    std = sigma_prev * math.sin(a * math.pi / 2)
    c = math.sqrt(sigma_prev**2 - std**2)
    assert c**2 + std**2 == pytest.approx(sigma_prev**2, rel=1e-12)
    assert step.std[0].item() == pytest.approx(std, rel=2e-6)
    torch.testing.assert_close(step.prev_sample, (1 - sigma_prev) * x0 + c * eps + std * z, rtol=1e-5, atol=1e-5)
    if a < 1:
        sde = flow_sde_step(v, x, sigma, sigma_prev, noise_level=a, schedule="flow_grpo", variance_noise=z)
        e = sde.std[0].item()  # its x' = (1 - s') x0 + k eps + e z with k^2 + e^2 != s'^2
        k = ((sde.prev_sample - (1 - sigma_prev) * x0 - e * z) / eps).median().item()
        assert abs(k**2 + e**2 - sigma_prev**2) > 1e-3


def test_cps_is_not_a_discretised_sde_of_the_flow():
    """The coefficients are the forward process's only where x0_hat and eps_hat are exact. With the exact
    velocity of Gaussian data x0 ~ N(1, .5^2) (x0_hat = E[x0 | x], shrunk), the std sigma_prev sin(a pi / 2)
    does not shrink with the step size, so more steps do not bring the samples to the data: exact moment
    propagation of this linear scheme (fp64, 200 uniform steps, last step a = 0) gives the mean exactly and the
    variance .2463 at a = 0 (the Euler ODE), .1590 at a = .8, against the data's .25. Sampled here, 50k draws."""
    m, s0, n, steps = 1.0, 0.5, 50_000, 200

    def velocity(x, sigma):  # E[noise - x0 | x_sigma = x], see tests/diffusion/test_sde.py
        var = (1 - sigma) ** 2 * s0**2 + sigma**2
        return -m + (sigma - (1 - sigma) * s0**2) / var * (x - (1 - sigma) * m)

    def final(a):
        g = torch.Generator().manual_seed(11)
        x = torch.randn(n, 1, generator=g)  # [N, 1]
        sigmas = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64).tolist()
        for i in range(steps):
            level = a if i < steps - 1 else 0.0
            x = flow_sde_step(velocity(x, sigmas[i]), x, sigmas[i], sigmas[i + 1], noise_level=level, schedule="cps",
                              generator=g).prev_sample  # [N, 1]
        return x[:, 0]  # [N]

    tol_mean, tol_var = 5 * 0.5 / math.sqrt(n), 5 * 0.25 * math.sqrt(2 / n)
    for a, var in ((0.0, 0.2463), (0.8, 0.1590)):
        x = final(a)
        assert abs(x.mean().item() - m) < tol_mean, a
        assert abs(x.var().item() - var) < tol_var + 1e-3, (a, x.var().item())


def test_exact_kl_with_the_reference_step():
    """Policy and reference share the std (it depends on sigma and a only), so gaussian_kl of their means is
    the exact KL of the two step distributions: torch's kl_divergence averaged over dims."""
    v, v_ref, x = _randn(10, 3)
    sig, prev = torch.tensor([0.9, 0.4]), torch.tensor([0.7, 0.2])
    pol = flow_sde_step(v, x, sig, prev, noise_level=0.8, schedule="cps", generator=torch.Generator().manual_seed(1))
    ref = flow_sde_step(v_ref, x, sig, prev, noise_level=0.8, schedule="cps", prev_sample=pol.prev_sample)
    assert torch.equal(pol.std, ref.std)
    kl = gaussian_kl(pol.mean, ref.mean, pol.std)  # [B]
    p, q = torch.distributions.Normal(pol.mean, pol.std), torch.distributions.Normal(ref.mean, ref.std)
    torch.testing.assert_close(kl, torch.distributions.kl_divergence(p, q).mean(dim=(1, 2, 3)))
    assert bool((kl > 0).all())


# ---------------------------------------------------------------------------------------------------------
# 8. config: cps is a valid policy.sde_schedule, its noise_level is checked at load
# ---------------------------------------------------------------------------------------------------------


def test_config_accepts_cps_and_checks_its_noise_level(tiny_config):
    cfg = load_config(tiny_config("sd3"), ["policy.sde_schedule=cps", "policy.noise_level=0.8"])
    assert cfg.policy.sde_schedule == "cps" and cfg.policy.noise_level == 0.8
    assert load_config(tiny_config("sd3"), ["policy.sde_schedule=cps", "policy.noise_level=1.0"])
    with pytest.raises(ConfigError) as e:
        load_config(tiny_config("sd3"), ["policy.sde_schedule=cps", "policy.noise_level=1.5"])
    assert "'policy.noise_level'" in str(e.value) and "[0, 1]" in str(e.value) and "1.5" in str(e.value)
    # the bound is cps's: flow_grpo's a has no upper bound
    assert load_config(tiny_config("sd3"), ["policy.noise_level=1.5"]).policy.noise_level == 1.5


def test_cli_rejects_a_cps_noise_level_above_one(tmp_path, capsys, tiny_config):
    from mmrl.cli import main

    out = tmp_path / "run"
    code = main(["train", tiny_config("sd3"), f"output_dir={out}", "policy.sde_schedule=cps", "policy.noise_level=1.5"])
    err = capsys.readouterr().err
    assert code == 2 and "'policy.noise_level'" in err and "Traceback" not in err
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------
# 9. a short training run of the tiny SD3 config with cps
# ---------------------------------------------------------------------------------------------------------


def test_tiny_sd3_trains_with_cps(tmp_path, tiny_config):
    """Two steps of configs/tiny/sd3_tiny.yaml with policy.sde_schedule=cps (a = 0.8, exact KL): the first
    inner ratio is exactly 1, the loss, KL and grad norm are finite, and the LoRA weights move."""
    from safetensors.torch import load_file

    from mmrl.loop.trainer import train

    train(load_config(tiny_config("sd3"), [f"output_dir={tmp_path}", "max_steps=2", "eval.every=0",
                                           "checkpoint.every=1", "logging.progress=false",
                                           "policy.sde_schedule=cps", "policy.noise_level=0.8"]))
    with open(os.path.join(tmp_path, "config.yaml")) as f:
        assert "sde_schedule: cps" in f.read()
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["ratio/first_max_abs_dev"] == 0.0
        assert all(math.isfinite(r[k]) for k in ("loss", "kl", "grad_norm", "reward/mean"))
    w1, w2 = (load_file(os.path.join(tmp_path, "checkpoints", f"step_{s:06d}", "policy.safetensors")) for s in (1, 2))
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)


def test_policy_rollout_with_cps_rescores_exactly(build_tiny, perturb_lora, prompts):
    """The tiny SD3 policy with cps and every step trained (a perturbed LoRA): the re-scored log-probs equal
    the rollout's bit for bit, and the last step (to sigma 0) is a point mass with log-prob 0."""
    policy = build_tiny("sd3", "sde_schedule=cps", "noise_level=0.8", "timesteps.select=all")
    perturb_lora(policy)
    ro = policy.rollout(prompts(["a red circle"]), group_size=2)
    assert torch.equal(ro.log_probs[:, -1], torch.zeros(2)) and bool((ro.log_probs[:, :-1] != 0).all())
    new = policy.log_probs(ro, torch.tensor([1, 0])).log_probs
    assert torch.equal(new, ro.log_probs[torch.tensor([1, 0])])
