"""DiffusionNFT's core (mmrl/algorithms/objectives/nft.py): the loss and its gradient against hand computations, the optimality
probability r, the old-policy decay schedule, and the limiting cases of the paper's objective."""

import os

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.algorithms.objectives.nft import nft_loss, old_decay, optimality
from tests import REPO


def T(rows):
    return torch.tensor(rows, dtype=torch.float32)


def loss_and_grad(v_theta, v_old, v_target, r, t, beta, adaptive):
    v_theta = v_theta.clone().requires_grad_(True)
    loss, metrics = nft_loss(v_theta, v_old, v_target, r, t, beta, adaptive)
    loss.sum().backward()
    return loss.detach(), v_theta.grad, metrics


# rows of two velocity dims (D = 2), beta = 0.5: v+ = 0.5 v_old + 0.5 v_theta, v- = 1.5 v_old - 0.5 v_theta
V_OLD, V_THETA, V_TARGET, R = T([[1, 0], [1, 1]]), T([[2, 1], [1, 3]]), T([[0, 0], [2, 0]]), T([1.0, 0.25])


def test_loss_and_gradient_table_plain_weighting():
    # row 0: v+ = [1.5, 0.5], v- = [0.5, -0.5]; L+ = (2.25 + 0.25) / 2 = 1.25, L- = (0.25 + 0.25) / 2 = 0.25
    #        loss = (1 * 1.25 + 0 * 0.25) / 0.5 = 2.5
    #        dloss/dv_theta = 2 / D [r (v+ - v) - (1 - r)(v- - v)] = [1.5, 0.5]
    # row 1: v+ = [1, 2], v- = [1, 0]; v+ - v = [-1, 2] -> L+ = 2.5; v- - v = [-1, 0] -> L- = 0.5
    #        loss = (0.25 * 2.5 + 0.75 * 0.5) / 0.5 = 2.0
    #        dloss/dv_theta = 0.25 [-1, 2] - 0.75 [-1, 0] = [0.5, 0.5]
    loss, grad, m = loss_and_grad(V_THETA, V_OLD, V_TARGET, R, T([0.5, 1.0]), 0.5, adaptive=False)
    torch.testing.assert_close(loss, T([2.5, 2.0]))
    torch.testing.assert_close(grad, T([[1.5, 0.5], [0.5, 0.5]]))
    torch.testing.assert_close(m["nft/loss_pos"].value, torch.tensor((1.25 + 2.5) / 2))
    torch.testing.assert_close(m["nft/loss_neg"].value, torch.tensor((0.25 + 0.5) / 2))
    # ||v_theta - v_old||^2 / D: row 0 (1 + 1) / 2 = 1, row 1 (0 + 4) / 2 = 2 -> mean 1.5
    torch.testing.assert_close(m["nft/old_deviate"].value, torch.tensor(1.5))


def test_loss_and_gradient_table_adaptive_weighting():
    # e = t (v_branch - v) (the x0 error), L = mean(e^2) / sg(mean |e|)
    # row 0, t = 0.5: e+ = [0.75, 0.25], w+ = 0.5, L+ = (0.5625 + 0.0625) / 2 / 0.5 = 0.625
    #                 e- = [0.25, -0.25], w- = 0.25, L- = 0.0625 / 0.25 = 0.25
    #        loss = (1 * 0.625) / 0.5 = 1.25
    #        dL+/dv+ = 2 t^2 (v+ - v) / (D w+) = 2 * 0.25 * [1.5, 0.5] / 1 = [0.75, 0.25]; dv+/dv_theta = beta
    #        dloss/dv_theta = (1 / beta) r beta [0.75, 0.25] = [0.75, 0.25]
    # row 1, t = 1: e+ = [-1, 2], w+ = 1.5, L+ = 2.5 / 1.5 = 5/3; e- = [-1, 0], w- = 0.5, L- = 0.5 / 0.5 = 1
    #        loss = (0.25 * 5/3 + 0.75 * 1) / 0.5 = 7/3
    #        dL+/dv+ = 2 [-1, 2] / (2 * 1.5) = [-2/3, 4/3]; dL-/dv- = 2 [-1, 0] / (2 * 0.5) = [-2, 0]
    #        dloss/dv_theta = 0.25 [-2/3, 4/3] - 0.75 [-2, 0] = [4/3, 1/3]
    loss, grad, _ = loss_and_grad(V_THETA, V_OLD, V_TARGET, R, T([0.5, 1.0]), 0.5, adaptive=True)
    torch.testing.assert_close(loss, T([1.25, 7 / 3]))
    torch.testing.assert_close(grad, T([[0.75, 0.25], [4 / 3, 1 / 3]]))


def test_adaptive_weight_floor_keeps_a_perfect_fit_finite():
    # v+ == v- == v (v_theta == v_old == v_target): e = 0, the weight is clipped at 1e-5, loss 0, grad 0
    v = T([[0.3, -0.2]])
    loss, grad, _ = loss_and_grad(v, v, v, T([0.7]), T([0.4]), 1.0, adaptive=True)
    assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("beta", [0.1, 1.0, 2.0])
def test_at_v_old_the_gradient_is_2r_minus_1_times_flow_matching(beta, adaptive):
    # At v_theta == v_old (the first update of a step when eta = 0): v+ = v- = v_old, so
    #   dloss/dv_theta = 2 / D [r (v_old - v) - (1 - r)(v_old - v)] = (2r - 1) d/dv_theta ||v_theta - v||^2 / D
    # for any beta (the 1 / beta cancels the beta of dv+-/dv_theta); adaptive: both branches share one weight.
    # beta = 1, r = 1 is flow matching itself (v+ = v_theta), the reference gradient here.
    gen = torch.Generator().manual_seed(0)
    v_old, v_target = torch.randn(4, 3, 2, generator=gen), torch.randn(4, 3, 2, generator=gen)
    r, t = T([0.0, 0.3, 0.5, 0.9]), T([0.2, 0.5, 0.7, 1.0])
    _, grad, _ = loss_and_grad(v_old, v_old, v_target, r, t, beta, adaptive)
    _, fm_grad, _ = loss_and_grad(v_old, v_old, v_target, torch.ones(4), t, 1.0, adaptive)
    torch.testing.assert_close(grad, (2 * r - 1)[:, None, None] * fm_grad)
    assert grad[2].abs().max() < 1e-6          # r = 1/2: no push either way (up to the rounding of v+- at beta 0.1)


def test_beta_1_r_1_is_plain_flow_matching():
    gen = torch.Generator().manual_seed(1)
    v_theta, v_old, v_target = (torch.randn(3, 5, generator=gen) for _ in range(3))
    loss, _ = nft_loss(v_theta, v_old, v_target, torch.ones(3), torch.full((3,), 0.5), 1.0, adaptive=False)
    torch.testing.assert_close(loss, (v_theta - v_target).pow(2).mean(1))


def test_optimality_probability_table():
    # r = 1/2 + 1/2 clip(A / 5, -1, 1): A / 5 = -2, -1, -0.5, 0, 0.2, 1, 1.5 -> clipped -1, -1, -0.5, 0, 0.2, 1, 1
    r = optimality(T([-10, -5, -2.5, 0, 1, 5, 7.5]), 5.0)
    torch.testing.assert_close(r, T([0.0, 0.0, 0.25, 0.5, 0.6, 1.0, 1.0]))


@pytest.mark.parametrize("k,rate,cap,delay,eta", [
    (0, 0.001, 0.5, 0, 0.0), (1, 0.001, 0.5, 0, 0.001), (250, 0.001, 0.5, 0, 0.25),   # the official default
    (500, 0.001, 0.5, 0, 0.5), (1000, 0.001, 0.5, 0, 0.5),
    (74, 0.0075, 0.999, 75, 0.0), (75, 0.0075, 0.999, 75, 0.0), (76, 0.0075, 0.999, 75, 0.0075),  # its OCR one
    (100, 0.0075, 0.999, 75, 0.1875), (300, 0.0075, 0.999, 75, 0.999),
    (10, 0.0, 0.5, 0, 0.0),                                          # rate 0: old = theta after every step
])
def test_old_decay_schedule_table(k, rate, cap, delay, eta):
    assert old_decay(k, rate, cap, delay) == pytest.approx(eta, abs=1e-12)


# ---------------------------------------------------------------- config errors at load

def _config(name):
    return os.path.join(REPO, "configs", "tiny", name)


def _error(name, *overrides):
    with pytest.raises(ConfigError) as e:
        load_config(_config(name), list(overrides))
    return str(e.value)


def test_objective_defaults_to_pg_and_unknown_names_list_the_valid_ones():
    assert load_config(_config("sd3_tiny.yaml")).algo.objective == "pg"
    msg = _error("sd3_tiny.yaml", "algo.objective=dpo")
    assert "algo.objective" in msg and "pg" in msg and "nft" in msg


@pytest.mark.parametrize("name", ["bandit.yaml", "vlm_tiny.yaml"])
def test_nft_with_a_policy_without_a_forward_process_loss_is_a_config_error(name):
    msg = _error(name, "algo.objective=nft", "algo.kl_beta=0")
    assert "algo.objective" in msg and "no forward-process loss" in msg and "algo.objective=pg" in msg


@pytest.mark.parametrize("override,key", [
    ("algo.nft.beta=0", "algo.nft.beta"), ("algo.nft.adv_scale=-1", "algo.nft.adv_scale"),
    ("algo.nft.timesteps=-1", "algo.nft.timesteps"), ("algo.nft.old_decay_rate=-0.1", "algo.nft.old_decay_rate"),
    ("algo.nft.old_decay_max=1.0", "algo.nft.old_decay_max"),
    ("algo.nft.old_decay_delay=-2", "algo.nft.old_decay_delay"),
    ("algo.policy_loss=grpo_guard", "algo.policy_loss"), ("algo.step_reweight=true", "algo.step_reweight"),
    ("algo.entropy_coef=0.01", "algo.entropy_coef"),
])
def test_nft_ranges_and_policy_gradient_only_options_name_the_key(override, key):
    assert key in _error("sd3_tiny.yaml", "algo.objective=nft", override)


def test_nft_knobs_are_not_checked_under_pg():
    # the policy gradient ignores them: a pg run with odd nft values still loads
    assert load_config(_config("sd3_tiny.yaml"), ["algo.nft.beta=0"]).algo.nft.beta == 0
