"""Turn-level credit (mmrl/algorithms/credit.py) against hand-computed tables."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.algorithms.credit import CreditConfig, discounted_returns, normalised_within, token_advantages
from rewards.sample import Sample


def episode(rewards, tokens, states=None):
    return Sample("p", "o", meta={"turn_rewards": rewards, "turn_tokens": tokens,
                                  "turn_states": states or [f"s{k}" for k in range(len(rewards))]})


def algo(credit, gamma=1.0, weight=1.0):
    return SimpleNamespace(credit=CreditConfig(credit, gamma, weight), adv_eps=0.0)


def test_discounted_returns_table():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, -1.0, 2.0], 1.0) == [2.0, 1.0, 2.0]
    assert discounted_returns([], 0.9) == []


def test_normalised_within_equal_keys_only():
    # keys a: [1, 3] -> mean 2, unbiased std sqrt(2); key b alone -> 0; key c no spread -> 0
    out = normalised_within([1.0, 3.0, 5.0, 2.0, 2.0], ["a", "a", "b", "c", "c"], 0.0)
    assert out[0] == pytest.approx(-1 / math.sqrt(2)) and out[1] == pytest.approx(1 / math.sqrt(2))
    assert out[2:] == [0.0, 0.0, 0.0]


def test_trajectory_credit_broadcasts_the_trajectory_advantage():
    samples = [episode([0.0, 1.0], [2, 1]), episode([0.0], [3])]
    adv, reward = torch.tensor([0.7, -0.7]), torch.tensor([1.0, 0.0])
    out = token_advantages(samples, adv, reward, 2, 4, algo("trajectory"))
    assert torch.equal(out, torch.tensor([[0.7] * 4, [-0.7] * 4]))


def test_turn_index_credit_table():
    """Group of 2: trajectory 0 turns r = [0, 1], trajectory 1 r = [0, 0, 0]; gamma 0.5.
    R_0 = [0.5, 1.0], R_1 = [0, 0, 0]. Turn 0: values [0.5, 0] -> (+1/sqrt2, -1/sqrt2);
    turn 1: [1.0, 0] -> (+1/sqrt2, -1/sqrt2); turn 2: only trajectory 1 -> 0."""
    samples = [episode([0.0, 1.0], [2, 1]), episode([0.0, 0.0, 0.0], [1, 1, 2])]
    adv, reward = torch.tensor([0.5, -0.5]), torch.tensor([1.0, 0.0])
    out = token_advantages(samples, adv, reward, 2, 5, algo("turn_index", gamma=0.5, weight=2.0))
    s = 1 / math.sqrt(2)
    want0 = [0.5 + 2 * s, 0.5 + 2 * s, 0.5 + 2 * s, 0.5, 0.5]           # columns 0-1 turn 0, column 2 turn 1
    want1 = [-0.5 - 2 * s, -0.5 - 2 * s, -0.5, -0.5, -0.5]              # turn 0, turn 1, turn 2 (alone)
    assert torch.allclose(out, torch.tensor([want0, want1]), atol=1e-6)


def test_state_credit_groups_equal_observations_across_turn_indices():
    """GiGPO anchor states: trajectory 0 visits A then B, trajectory 1 visits A, A (stayed), then B.
    Undiscounted returns: traj 0 [1, 1] at (A, B); traj 1 [0, 0, 0] at (A, A, B).
    State A: [1, 0, 0] -> mean 1/3, std sqrt(1/3); state B: [1, 0] -> +-1/sqrt2."""
    samples = [episode([0.0, 1.0], [1, 1], ["A", "B"]), episode([0.0, 0.0, 0.0], [1, 1, 1], ["A", "A", "B"])]
    out = token_advantages(samples, torch.zeros(2), torch.tensor([1.0, 0.0]), 2, 3, algo("state"))
    sd = math.sqrt(1 / 3)
    a_hi, a_lo, b = (1 - 1 / 3) / sd, (0 - 1 / 3) / sd, 1 / math.sqrt(2)
    assert torch.allclose(out, torch.tensor([[a_hi, b, 0.0], [a_lo, a_lo, -b]]), atol=1e-6)


def test_an_unscorable_trajectory_gets_no_turn_credit():
    samples = [episode([1.0], [2]), episode([0.0], [2])]
    out = token_advantages(samples, torch.tensor([0.0, 0.0]), torch.tensor([float("nan"), 0.0]), 2, 2,
                           algo("turn_index"))
    assert torch.equal(out[0], torch.zeros(2))
    assert torch.equal(out[1], torch.zeros(2))         # the unscorable one takes no part: row 1 is alone


def test_turn_credit_needs_an_env_section(repo_root):
    with pytest.raises(ConfigError, match=r"algo\.credit.*needs an env section"):
        load_config(f"{repo_root}/configs/tiny/vlm_tiny.yaml", ["algo.credit.name=turn_index"])
    with pytest.raises(ConfigError, match=r"algo\.credit\.name.*unknown credit 'turns'; valid names: state, trajectory, turn_index"):
        load_config(f"{repo_root}/configs/tiny/agent_tiny.yaml", ["algo.credit.name=turns"])
    cfg = load_config(f"{repo_root}/configs/tiny/agent_tiny.yaml", ["algo.credit.name=state"])
    assert cfg.algo.credit.name == "state"
