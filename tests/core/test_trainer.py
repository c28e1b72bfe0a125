"""The training loop on the test-only bandit policy: learning, contract metrics,
non-finite handling, dynamic sampling, KL."""

import os

import pytest
import torch

from mmrl.state import checkpoint
from mmrl.loop.update import NonFiniteError

CONTRACT = ["step", "reward/mean", "reward/match/mean", "loss", "grad_norm", "clip_frac", "time/step_s"]


def test_grpo_drives_bandit_from_chance_to_optimum(tmp_path, read_metrics, run_bandit, train_rows):
    run_bandit(tmp_path)
    rows = read_metrics(tmp_path)
    evals = [r["eval/reward/mean"] for r in rows if "eval/reward/mean" in r]
    assert evals[0] == pytest.approx(0.125)          # uniform start: every arm ties, argmax picks arm 0
    assert evals[-1] >= 0.99
    train = train_rows(tmp_path)
    assert sum(r["reward/mean"] for r in train[:3]) / 3 < 0.35     # chance is 1/8 per position
    assert sum(r["reward/mean"] for r in train[-3:]) / 3 > 0.85


def test_on_policy_ratio_is_exactly_one_at_first_inner_step(tmp_path, run_bandit, train_rows):
    run_bandit(tmp_path, "max_steps=5")
    for r in train_rows(tmp_path):
        assert r["ratio/first_max_abs_dev"] == 0.0
    # the second epoch is off-policy, so the ratio must have moved somewhere
    assert max(r["ratio/max_abs_dev"] for r in train_rows(tmp_path)) > 0


def test_run_directory_and_metric_contract(tmp_path, run_bandit, train_rows):
    run_bandit(tmp_path, "max_steps=4", "algo.kl_beta=0.1", "logging.save_samples_every=2", "eval.every=2")
    for name in ("config.yaml", "metrics.jsonl", "checkpoints", "samples", "reward_curve.png", "before_after.md"):
        assert os.path.exists(tmp_path / name), name
    rows = train_rows(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        for key in CONTRACT + ["kl"]:
            assert key in r and r[key] is not None, key
    assert os.path.isfile(tmp_path / "samples" / "step_000002.jsonl")
    assert checkpoint.latest(str(tmp_path / "checkpoints")).endswith("step_000004")


def test_no_kl_metric_and_no_reference_call_when_beta_is_zero(tmp_path, monkeypatch, run_bandit, train_rows):
    from mmrl.testing.bandit import BanditPolicy

    def boom(*a, **k):
        raise AssertionError("reference forward ran with kl_beta=0")

    monkeypatch.setattr(BanditPolicy, "reference_log_probs", boom)
    run_bandit(tmp_path, "max_steps=2")
    assert all("kl" not in r for r in train_rows(tmp_path))


def test_kl_penalty_keeps_policy_closer_to_reference(tmp_path, run_bandit):
    free = run_bandit(tmp_path / "free", "max_steps=15")
    tied = run_bandit(tmp_path / "tied", "max_steps=15", "algo.kl_beta=1.0", "algo.kl_estimator=k2")
    dist = [r.policy.net.theta.norm().item() for r in (free, tied)]     # distance from the zero (uniform) start
    assert dist[1] < dist[0]


def test_nonfinite_step_is_skipped_and_counted(tmp_path, run_bandit, train_rows):
    run = run_bandit(tmp_path, "max_steps=5", "policy.nonfinite_steps=[2]", "train.update_epochs=1")
    rows = train_rows(tmp_path)
    assert [r["nonfinite/skipped"] for r in rows] == [0, 0, 1, 1, 1]
    assert torch.isfinite(run.policy.net.theta).all()


def test_nonfinite_in_a_row_stops_and_keeps_last_good_checkpoint(tmp_path, run_bandit):
    with pytest.raises(NonFiniteError, match="in a row"):
        run_bandit(tmp_path, "max_steps=10", "checkpoint.every=1", "policy.nonfinite_steps=[3,4,5]",
                   "optim.max_nonfinite_in_a_row=3", "train.update_epochs=1")
    latest = checkpoint.latest(str(tmp_path / "checkpoints"))
    assert latest.endswith("step_000005")   # steps 4 and 5 were skipped but saved; 6 never ran
    from safetensors.torch import load_file
    assert torch.isfinite(load_file(os.path.join(latest, "policy.safetensors"))["theta"]).all()


def test_dynamic_sampling_fills_the_step_with_informative_groups(tmp_path, run_bandit, train_rows):
    run_bandit(tmp_path, "max_steps=12", "algo.filter.name=dynamic", "algo.filter.max_resample_rounds=4",
               "train.group_size=4")
    rows = train_rows(tmp_path)
    assert any(r["filter/rounds"] > 1 for r in rows)
    assert all(1 <= r["filter/rounds"] <= 5 for r in rows)
    # every step here fills up within the 5 rounds: exactly prompts_per_step (4) groups are trained
    assert [r["filter/kept_groups"] for r in rows] == [4] * 12
    # one round suffices exactly when no group of the first round lacks reward spread
    assert [r["filter/rounds"] == 1 for r in rows] == [r["adv/zero_std_frac"] == 0 for r in rows]


def test_starpo_keeps_the_configured_fraction(tmp_path, run_bandit, train_rows):
    run_bandit(tmp_path, "max_steps=3", "algo.filter.name=starpo", "algo.filter.keep_frac=0.5")
    assert all(r["filter/kept_groups"] == 2 for r in train_rows(tmp_path))


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_grad_accumulation_matches_single_microbatch(tmp_path, aggregation, run_bandit):
    # Adam's eps is raised so that float noise on zero gradients is not amplified to +-lr
    common = ["max_steps=2", "train.update_epochs=1", "optim.eps=1.0", f"algo.aggregation={aggregation}"]
    a = run_bandit(tmp_path / "a", *common, "train.samples_per_microbatch=32")
    b = run_bandit(tmp_path / "b", *common, "train.samples_per_microbatch=4")
    c = run_bandit(tmp_path / "c", *common, "train.samples_per_microbatch=4", "train.grad_accum_steps=8")
    assert a.policy.net.theta.abs().max() > 1e-3                         # moved from the zero start
    torch.testing.assert_close(a.policy.net.theta, b.policy.net.theta, rtol=0, atol=1e-6)
    torch.testing.assert_close(a.policy.net.theta, c.policy.net.theta, rtol=0, atol=1e-6)


def test_fresh_run_refuses_to_overwrite_a_finished_run(tmp_path, read_metrics, run_bandit):
    from mmrl.config import ConfigError

    run_bandit(tmp_path, "max_steps=2")
    with pytest.raises(ConfigError, match="already holds a run"):
        run_bandit(tmp_path, "max_steps=2")
    run_bandit(tmp_path, "max_steps=3", "resume=auto")
    steps = [r["step"] for r in read_metrics(tmp_path)]
    assert steps == [0, 1, 2, 3]                       # one eval row at step 0, no duplicates


def test_a_new_run_in_a_dir_without_checkpoints_starts_a_clean_metrics_file(tmp_path, read_metrics, run_bandit):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "stale": 1}\n')
    run_bandit(tmp_path, "max_steps=1")
    assert all("stale" not in r for r in read_metrics(tmp_path))
