"""GRPO-Guard (arXiv 2510.22319) terms of the diffusion policy on tiny models: the rollout's step means,
the drift, the step std and the 1/dt weights that `Scores` carries to the core, and a CLI run with both
options on."""

import json
import math
import os
import subprocess

import pytest
import torch

from diffusion.sampler import rescore, transitions
from mmrl.config import ConfigError

TEXTS = ["a red circle", "a blue square"]


@pytest.fixture(scope="module")
def rolled(build_tiny, prompts):
    """SD3 with per-sample step plans (DanceGRPO's random fraction), built for RatioNorm; 2 prompts x 2."""
    policy = build_tiny("sd3", "timesteps.select=fraction", "timesteps.fraction=0.5", "forward_batch=4",
                        ratio_norm=True, step_reweight=True)
    return policy, policy.rollout(prompts(TEXTS), group_size=2)


def test_rollout_records_the_trained_steps_means(rolled):
    policy, ro = rolled
    n, t = ro.mask.shape
    assert ro.state["old_mean"].shape[:2] == (n, t)
    # the plans differ per sample: a column is not one denoising step for every sample
    assert len({tuple(r) for r in ro.state["step_index"].tolist()}) > 1


def test_on_policy_drift_is_zero_and_std_weight_follow_the_schedule(rolled):
    policy, ro = rolled
    scores = policy.log_probs(ro, torch.arange(len(ro)))
    assert torch.equal(scores.log_probs, ro.log_probs)                # ratio exactly 1
    assert torch.equal(scores.mean_drift, torch.zeros_like(ro.log_probs))  # mu_theta == mu_old bit for bit
    sig, sig_next = policy.sched.coef.double(), policy.sched.coef_next.double()
    a = policy.cfg.noise_level
    for i in range(len(ro)):
        for j in range(ro.mask.shape[1]):
            k = int(ro.state["step_index"][i, j])
            dt = float(sig[k] - sig_next[k])
            denom = 1 - (float(sig_next[k]) if sig[k] >= 1 else float(sig[k]))
            s = a * math.sqrt(float(sig[k]) / denom) * math.sqrt(dt)  # Flow-GRPO: g(sigma) sqrt(dt)
            assert float(scores.step_std[i, j]) == pytest.approx(s, rel=1e-5)
            assert float(scores.step_weight[i, j]) == pytest.approx(1 / dt, rel=1e-5)


def test_off_policy_drift_and_the_ratio_norm_identity(rolled, perturb_lora):
    """After a weight change, b = mean_d (mu_theta - mu_old)^2 / (2 s^2), and s (log r + b) equals
    mean_d(eps (mu_theta - mu_old)) with eps = (x' - mu_old) / s, the rollout's own noise."""
    policy, ro = rolled
    perturb_lora(policy, scale=0.05)
    idx = torch.arange(len(ro))
    scores = policy.log_probs(ro, idx)
    rows, cols, x, x_next, steps, conds = transitions(ro.state, ro.mask, idx)
    with torch.no_grad():
        step = rescore(policy._denoiser(policy.model, policy.sched), x, x_next, steps, conds, policy.cfg.noise_level)
    mu_old = ro.state["old_mean"][rows, cols].double()
    delta = step.mean.double() - mu_old                                     # [M, ...]
    s = step.std.double()                                                   # [M, 1, ...]
    b = (delta ** 2).flatten(1).mean(1) / (2 * s.flatten() ** 2)            # [M]
    drift = scores.mean_drift.detach()[rows, cols].double()
    assert float(drift.min()) > 0
    torch.testing.assert_close(drift, b, rtol=1e-4, atol=0)
    log_r = (scores.log_probs.detach() - ro.log_probs)[rows, cols].double()
    eps = (x_next.double() - mu_old) / s
    expected = (eps * delta).flatten(1).mean(1)                             # [M]
    assert float(expected.abs().max()) > 1e-4                               # far above the fp32 tolerance below
    # log r is a difference of two fp32 log-probs of size ~1: its error is ~1e-7
    torch.testing.assert_close(s.flatten() * (log_r + drift), expected, rtol=0, atol=5e-7)


def test_without_ratio_norm_nothing_extra_is_stored(build_tiny, prompts):
    policy = build_tiny("sd3", "forward_batch=4")
    ro = policy.rollout(prompts(TEXTS[:1]), group_size=2)
    assert "old_mean" not in ro.state
    assert policy.log_probs(ro, torch.arange(2)).mean_drift is None


def test_ddim_has_no_step_weight_and_refuses_step_reweight(build_tiny, prompts):
    policy = build_tiny("sd", "forward_batch=4", ratio_norm=True)
    ro = policy.rollout(prompts(TEXTS[:1]), group_size=2)
    scores = policy.log_probs(ro, torch.arange(2))
    assert scores.step_weight is None and scores.mean_drift is not None
    with pytest.raises(ConfigError, match="algo.step_reweight.*DDIM"):
        build_tiny("sd", "forward_batch=4", step_reweight=True)


@pytest.mark.slow
@pytest.mark.integration
def test_cli_run_with_both_options(tmp_path, mmrl_cmd, tiny_config):
    """Two steps of the SD3 smoke config with RatioNorm and the 1/dt reweighting, two update epochs (so the
    second epoch is off-policy and the drift is non-zero): finite loss, on-policy ratio exactly 1."""
    cmd = mmrl_cmd("train", tiny_config("sd3"), f"output_dir={tmp_path}", "max_steps=2", "eval.every=0",
                   "checkpoint.every=0", "train.update_epochs=2", "algo.policy_loss=grpo_guard", "algo.step_reweight=true",
                   "algo.clip_low=1.0e-5", "algo.clip_high=1.0e-5")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip() and "loss" in line]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) and math.isfinite(r["kl"])
        assert r["ratio/first_max_abs_dev"] == 0.0
        assert r["ratio_norm/drift"] > 0 and math.isfinite(r["ratio/raw_mean"])
