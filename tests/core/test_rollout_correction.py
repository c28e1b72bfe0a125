"""Rollout-training mismatch correction (algo.rollout_correction, mmrl/algorithms/rollout_correction.py): the weights
of each mode against hand-computed tables, their place in the loss, the mismatch metrics of a training step,
and the checks at load."""

import dataclasses
import math

import pytest
import torch

from mmrl.testing.bandit import BanditPolicy
from mmrl.config import ConfigError
from mmrl.algorithms.rollout_correction import weights

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.3, 0.0]])
ENGINE = torch.tensor([[-1.0, -1.0, -1.5], [-0.3, -1.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
E, E07 = math.e, math.exp(0.7)   # token log rho: [[0, -1, 1], [0, 0.7, pad]]; per sequence: [0, 0.7]

TABLE = [  # mode, C_max, C_min, weights, outside the band
    ("token_truncate", 2.0, None, [[1, 1 / E, 2], [1, 2, 0]], [[0, 0, 1], [0, 1, 0]]),
    ("token_truncate", 2.0, 0.5, [[1, 0.5, 2], [1, 2, 0]], [[0, 1, 1], [0, 1, 0]]),
    ("token_mask", 2.0, 0.5, [[1, 0, 0], [1, 0, 0]], [[0, 1, 1], [0, 1, 0]]),
    ("token_mask", 3.0, None, [[1, 1 / E, E], [1, E07, 0]], [[0, 0, 0], [0, 0, 0]]),
    ("sequence_truncate", 2.0, None, [[1, 1, 1], [2, 2, 0]], [[0, 0, 0], [1, 1, 0]]),
    ("sequence_mask", 2.0, None, [[1, 1, 1], [0, 0, 0]], [[0, 0, 0], [1, 1, 0]]),
    ("sequence_mask", None, 1.5, [[0, 0, 0], [E07, E07, 0]], [[1, 1, 1], [0, 0, 0]]),
]


@pytest.mark.parametrize("mode,c_max,c_min,want,outside", TABLE)
def test_weights_table(mode, c_max, c_min, want, outside):
    c = weights(OLD, ENGINE, MASK, mode, c_max, c_min)
    torch.testing.assert_close(c.weight, torch.tensor(want, dtype=torch.float32))
    assert c.outside.tolist() == [[bool(x) for x in row] for row in outside]


def test_an_unreported_engine_log_prob_counts_as_no_mismatch():
    engine = ENGINE.clone()
    engine[0, 1] = float("nan")                                  # token log rho 0 instead of -1
    c = weights(OLD, engine, MASK, "token_truncate", 2.0)
    assert c.weight[0].tolist() == [1.0, 1.0, 2.0]
    c = weights(OLD, engine, MASK, "sequence_truncate", 5.0)
    torch.testing.assert_close(c.weight[0], torch.full((3,), E))   # exp(0 + 0 + 1)


def test_the_weights_multiply_each_surrogate_term_only():
    from mmrl.algorithms.losses import LossSpec, aggregate, clipped_surrogate, policy_loss
    from mmrl.types import Scores

    torch.manual_seed(0)
    new = (OLD + 0.1 * torch.randn(2, 3)).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    w = weights(OLD, ENGINE, MASK, "token_truncate", 2.0).weight
    spec = LossSpec(kl_beta=0.0)
    loss, metrics = policy_loss(Scores(log_probs=new), OLD, adv, MASK, None, spec, None, w)
    l, _ = clipped_surrogate(new, OLD, adv, MASK, clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(loss, aggregate(l * w, MASK.float(), "token-mean"))
    plain, _ = policy_loss(Scores(log_probs=new), OLD, adv, MASK, None, spec)
    assert not torch.allclose(loss, plain)


def _with_engine(offset: float):
    rollout = BanditPolicy.rollout

    def sampled_by_an_engine(self, prompts, group_size):
        ro = rollout(self, prompts, group_size)
        return dataclasses.replace(ro, engine_log_probs=ro.log_probs - offset)   # log rho = offset everywhere

    return sampled_by_an_engine


def test_a_step_reports_the_mismatch_and_weights_the_update(tmp_path, monkeypatch, run_bandit, train_rows):
    monkeypatch.setattr(BanditPolicy, "rollout", _with_engine(0.1))
    steps = ["max_steps=1", "eval.every=0", "train.update_epochs=1"]
    run_bandit(tmp_path / "plain", *steps)
    (plain,) = train_rows(tmp_path / "plain")
    assert plain["rollout/logprob_abs_diff"] == pytest.approx(0.1, abs=1e-6)
    assert "rollout/is_weight_mean" not in plain                    # measured, not corrected

    monkeypatch.setattr("mmrl.config.policies.validate_rollout_correction", lambda cfg, algo: None)  # the bandit has no engine
    run_bandit(tmp_path / "tis", *steps, "algo.rollout_correction.mode=token_truncate", "algo.rollout_correction.max=1.05")
    (tis,) = train_rows(tmp_path / "tis")
    assert tis["rollout/is_weight_mean"] == pytest.approx(1.05)      # rho = e^0.1 = 1.105, truncated at 1.05
    assert tis["rollout/is_outside_frac"] == 1.0
    assert tis["grad_norm"] == pytest.approx(1.05 * plain["grad_norm"], rel=1e-5)   # every term weighted 1.05
    assert tis["ratio/first_max_abs_dev"] == 0.0                     # the on-policy ratio is untouched


def test_the_correction_is_checked_at_load(tmp_path, bandit_cfg):
    with pytest.raises(ConfigError, match="algo.rollout_correction.mode.*none, sequence_mask, sequence_truncate, token_mask"):
        bandit_cfg(tmp_path, "algo.rollout_correction.mode=tis")
    with pytest.raises(ConfigError, match="samples with the forward it trains"):
        bandit_cfg(tmp_path, "algo.rollout_correction.mode=token_truncate")
    with pytest.raises(ConfigError, match=r"algo.rollout_correction.min.*below"):
        bandit_cfg(tmp_path, "algo.rollout_correction.mode=token_mask", "algo.rollout_correction.min=3")
    with pytest.raises(ConfigError, match="drop nothing"):
        bandit_cfg(tmp_path, "algo.rollout_correction.mode=sequence_mask", "algo.rollout_correction.max=null")
    vlm = bandit_cfg.__globals__["BANDIT"].replace("bandit.yaml", "vlm_tiny.yaml")
    from mmrl.config import load_config

    with pytest.raises(ConfigError, match="policy.backend is 'hf'"):
        load_config(vlm, [f"output_dir={tmp_path}", "algo.rollout_correction.mode=token_truncate"])
