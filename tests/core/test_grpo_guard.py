"""GRPO-Guard (arXiv 2510.22319) in the core: RatioNorm and the per-step gradient reweighting, on
hand-computed [N, T] tables (numbers worked out in the comments), the paper's claims about the
normalised ratio on Gaussian steps, and the load-time checks of the two algo keys."""

from __future__ import annotations

import math
import os

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.algorithms.guard import ratio_norm
from mmrl.algorithms.losses import LossSpec, clipped_surrogate, policy_loss
from mmrl.distributed.reduce import Metric
from mmrl.types import Scores
from mmrl.algorithms.objectives.pg import loss_spec
from mmrl.config.policies import needs_ratio_norm
from tests import BANDIT, REPO

SD3_TINY = os.path.join(REPO, "configs", "tiny", "sd3_tiny.yaml")
SD_TINY = os.path.join(REPO, "configs", "tiny", "sd_tiny.yaml")


def T(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, atol=1e-6):
    actual = actual.value if isinstance(actual, Metric) else actual
    exp = expected if isinstance(expected, torch.Tensor) else T(expected)
    torch.testing.assert_close(actual.float(), exp, rtol=0, atol=atol)


# ------------------------------------------------------------------ RatioNorm, by hand
# Two samples, two trained steps each (column t = the t-th trained step of that sample).
LOG_R = T([[-0.5, 0.2], [0.0, -1.0]])       # log pi_theta - log pi_old
STD = T([[0.5, 0.5], [0.2, 0.1]])           # s of each step
DRIFT = T([[0.3, 0.0], [0.0, 0.6]])         # b = ||mu_theta - mu_old||^2 / (2 D s^2)
# log r_hat = s (log r + b):
#   (0,0) 0.5 * (-0.5 + 0.3) = -0.1     (0,1) 0.5 * (0.2 + 0) = 0.1
#   (1,0) 0.2 * ( 0.0 + 0.0) =  0.0     (1,1) 0.1 * (-1.0 + 0.6) = -0.04
LOG_R_HAT = T([[-0.1, 0.1], [0.0, -0.04]])
ADV = T([1.0, -1.0])
EPS = 0.05                                   # clip range [0.95, 1.05]


def test_ratio_norm_table():
    close(ratio_norm(LOG_R, STD, DRIFT), LOG_R_HAT)


def test_clipped_surrogate_with_ratio_norm_table():
    # r_hat = exp(LOG_R_HAT) = [[0.904837, 1.105171], [1.0, 0.960789]]
    # A = +1 (row 0): l = max(-r, -clip(r)):  (0,0) max(-0.904837, -0.95) = -0.904837 (left of 1 - eps:
    #                 a positive advantage is never clipped there);  (0,1) max(-1.105171, -1.05) = -1.05 (clipped)
    # A = -1 (row 1): l = max(r, clip(r)):    (1,0) 1.0;  (1,1) 0.960789 (inside the band)
    l, m = clipped_surrogate(LOG_R, torch.zeros(2, 2), ADV, torch.ones(2, 2), clip_low=EPS, clip_high=EPS,
                             norm=(STD, DRIFT))
    close(l, [[-0.904837, -1.05], [1.0, 0.960789]])
    close(m["clip_frac"], 0.25)                               # only (0,1): r_hat > 1.05 with A > 0
    close(m["clip_frac/high"], 0.25)
    close(m["ratio/mean"], (0.904837 + 1.105171 + 1.0 + 0.960789) / 4)       # 0.992699
    # the paper's diagnostic: the raw ratio exp(LOG_R) = [[0.606531, 1.221403], [1.0, 0.367879]], mean 0.798953
    close(m["ratio/raw_mean"], 0.798953)
    close(m["ratio_norm/drift"], (0.3 + 0.0 + 0.0 + 0.6) / 4)                # 0.225


def test_policy_loss_with_ratio_norm_table():
    # token-mean of the table above: (-0.904837 - 1.05 + 1.0 + 0.960789) / 4 = 0.005952 / 4 = 0.001488
    scores = Scores(log_probs=LOG_R.clone(), step_std=STD, mean_drift=DRIFT)
    loss, _ = policy_loss(scores, torch.zeros(2, 2), ADV, torch.ones(2, 2), None,
                          LossSpec(policy_loss="grpo_guard", clip_low=EPS, clip_high=EPS))
    close(loss, 0.001488)


def test_ratio_norm_on_policy_ratio_is_exactly_one_and_the_gradient_is_s_times_the_plain_one():
    # new == old and mu_theta == mu_old (b = 0): log r_hat = s * 0 = 0, r_hat = exp(0) = 1 exactly.
    # d loss / d logp = -A * s * r_hat / 4 (token-mean over 4 actions):
    #   row 0 (A = 1):  -0.5/4 = -0.125, -0.5/4 = -0.125;   row 1 (A = -1): 0.2/4 = 0.05, 0.1/4 = 0.025
    old = T([[-1.3, 0.7], [2.0, -0.4]])
    logp = old.clone().requires_grad_(True)
    drift = torch.zeros(2, 2, requires_grad=True)        # the drift keeps its grad (through mu_theta)
    scores = Scores(log_probs=logp, step_std=STD, mean_drift=drift)
    loss, m = policy_loss(scores, old, ADV, torch.ones(2, 2), None, LossSpec(policy_loss="grpo_guard",
                                                                              clip_low=EPS, clip_high=EPS))
    assert float(m["ratio/max_abs_dev"].value) == 0.0
    assert float(m["ratio/mean"].value) == 1.0
    loss.backward()
    close(logp.grad, [[-0.125, -0.125], [0.05, 0.025]])
    close(drift.grad, [[-0.125, -0.125], [0.05, 0.025]])  # d log r_hat / d b = s, as for log r


def test_ratio_norm_off_is_the_plain_ratio():
    # the default path ignores the GRPO-Guard fields entirely: same loss with or without them
    scores = Scores(log_probs=LOG_R.clone(), step_std=STD, mean_drift=DRIFT, step_weight=torch.full((2, 2), 7.0))
    plain, m_plain = policy_loss(Scores(log_probs=LOG_R.clone()), torch.zeros(2, 2), ADV, torch.ones(2, 2), None,
                                 LossSpec(clip_low=EPS, clip_high=EPS))
    same, m_same = policy_loss(scores, torch.zeros(2, 2), ADV, torch.ones(2, 2), None,
                               LossSpec(clip_low=EPS, clip_high=EPS))
    assert torch.equal(plain, same) and m_plain.keys() == m_same.keys()
    assert "ratio/raw_mean" not in m_plain


# ------------------------------------------------------------------ gradient reweighting, by hand
# Sample 0 trains steps with dt 0.25 and 0.5 (weights 4, 2); sample 1 trains a step with dt 0.1 (weight 10)
# and one padding column (mask 0, weight 0 from the adapter's scatter).
WEIGHT = T([[4.0, 2.0], [10.0, 0.0]])
MASK = T([[1, 1], [1, 0]])
KL = T([[0.1, 0.2], [0.3, 9.9]])             # 9.9 at padding: masked out


def test_step_reweight_table_surrogate_only():
    # on-policy (r = 1): l = -A r = [[-1, -1], [1, 1]]; times the weights: [[-4, -2], [10, 0]]
    # plus beta * KL (not reweighted), beta = 1: [[-3.9, -1.8], [10.3, .]]
    # token-mean over the 3 valid actions: (-3.9 - 1.8 + 10.3) / 3 = 4.6 / 3 = 1.533333
    old = T([[-1.0, -2.0], [-3.0, 0.0]])
    logp = old.clone().requires_grad_(True)
    scores = Scores(log_probs=logp, kl=KL, step_weight=WEIGHT)
    loss, m = policy_loss(scores, old, ADV, MASK, None, LossSpec(kl_beta=1.0, step_reweight=True))
    close(loss, 4.6 / 3, atol=1e-5)
    close(m["pg_loss"], (-4.0 - 2.0 + 10.0) / 3, atol=1e-5)       # the reweighted surrogate alone: 1.333333
    # d loss / d logp = -A * w * r / 3:  row 0: -4/3, -2/3;  row 1: 10/3, 0 (padding)
    loss.backward()
    close(logp.grad, [[-4 / 3, -2 / 3], [10 / 3, 0.0]], atol=1e-5)


def test_both_options_together_table():
    # RatioNorm table above times the weights [[4, 2], [10, 1]]:
    #   l = [[-0.904837 * 4, -1.05 * 2], [1.0 * 10, 0.960789 * 1]] = [[-3.619348, -2.1], [10.0, 0.960789]]
    #   token-mean: (-3.619348 - 2.1 + 10.0 + 0.960789) / 4 = 5.241441 / 4 = 1.310360
    scores = Scores(log_probs=LOG_R.clone(), step_std=STD, mean_drift=DRIFT, step_weight=T([[4.0, 2.0], [10.0, 1.0]]))
    loss, _ = policy_loss(scores, torch.zeros(2, 2), ADV, torch.ones(2, 2), None,
                          LossSpec(policy_loss="grpo_guard", clip_low=EPS, clip_high=EPS, step_reweight=True))
    close(loss, 1.310360, atol=1e-5)


@pytest.mark.parametrize("spec,needs", [(LossSpec(policy_loss="grpo_guard"), "algo.policy_loss=grpo_guard"),
                                        (LossSpec(step_reweight=True), "algo.step_reweight")])
def test_missing_terms_name_the_key(spec, needs):
    with pytest.raises(ValueError, match=needs):
        policy_loss(Scores(log_probs=torch.zeros(1, 1)), torch.zeros(1, 1), T([1.0]), torch.ones(1, 1), None, spec)


# ------------------------------------------------------------------ the paper's claims on a Gaussian step
def _gaussian_step_ratios(s: float, delta: torch.Tensor, k: int = 20_000, seed: int = 0):
    """k draws x' = mu_old + s eps of a D-dim Gaussian step; log-probs averaged over D (the convention)."""
    gen = torch.Generator().manual_seed(seed)
    d = delta.numel()
    mu_old = torch.randn(d, generator=gen, dtype=torch.float64)
    mu_new = mu_old + delta
    eps = torch.randn(k, d, generator=gen, dtype=torch.float64)
    x = mu_old + s * eps                                                       # [k, D]
    lp_new = torch.distributions.Normal(mu_new, s).log_prob(x).mean(-1)       # [k]
    lp_old = torch.distributions.Normal(mu_old, s).log_prob(x).mean(-1)       # [k]
    b = ((mu_new - mu_old) ** 2).mean() / (2 * s ** 2)
    log_r = lp_new - lp_old
    return eps, log_r, b, ratio_norm(log_r, torch.tensor(s, dtype=torch.float64), b).double()


def test_ratio_norm_removes_the_left_shift_and_the_step_dependence():
    delta = torch.tensor([0.02, -0.01, 0.03, 0.0], dtype=torch.float64)        # mu_theta - mu_old, D = 4
    spread = float(delta.norm()) / delta.numel()                               # std of mean_d(eps Delta)
    for s in (0.05, 0.5):
        eps, log_r, b, log_r_hat = _gaussian_step_ratios(s, delta)
        # log r_hat = mean_d(eps Delta) exactly: its law does not involve s
        torch.testing.assert_close(log_r_hat, (eps * delta).mean(-1), rtol=0, atol=1e-8)  # fp32 step math
        tol = 5 * spread / math.sqrt(eps.shape[0])                             # 5 standard errors
        assert abs(float(log_r_hat.mean())) < tol                              # centred: mean 0
        assert abs(float(log_r_hat.std()) - spread) < 0.05 * spread
        # the raw log-ratio: mean -b < 0 (left shift), spread ~ 1/s
        assert abs(float(log_r.mean()) + float(b)) < tol / s
        assert abs(float(log_r.std()) - spread / s) < 0.05 * spread / s


# ------------------------------------------------------------------ config
def test_defaults_are_off_and_loss_spec_carries_the_keys():
    algo = load_config(SD3_TINY, []).algo
    assert algo.policy_loss == "ppo_clip" and not needs_ratio_norm(algo) and not algo.step_reweight
    algo = load_config(SD3_TINY, ["algo.policy_loss=grpo_guard", "algo.step_reweight=true"]).algo
    spec = loss_spec(algo)
    assert needs_ratio_norm(algo) and spec.policy_loss == "grpo_guard" and spec.step_reweight


@pytest.mark.parametrize("override,key", [("algo.policy_loss=grpo_guard", "algo.policy_loss"),
                                          ("algo.step_reweight=true", "algo.step_reweight")])
def test_policies_without_gaussian_steps_are_a_config_error(override, key):
    with pytest.raises(ConfigError, match=f"config key '{key}'.*policy 'bandit'"):
        load_config(BANDIT, [override])


def test_step_reweight_with_ddim_is_a_config_error_ratio_norm_is_not():
    with pytest.raises(ConfigError, match="config key 'algo.step_reweight'.*DDIM"):
        load_config(SD_TINY, ["algo.step_reweight=true"])
    assert needs_ratio_norm(load_config(SD_TINY, ["algo.policy_loss=grpo_guard"]).algo)
