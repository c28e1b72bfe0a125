"""The EMA of the trained weights (`train.ema_decay`, mmrl/loop/ema.py): its update rule against hand-computed
tables, the swap for evaluation that puts the trained weights back bit for bit, skipped steps, and in the
trainer: evaluation on the average, the export file, resume, and decay 0 keeping nothing."""

import math
import os
import shutil
from types import SimpleNamespace

import pytest
import torch

import mmrl.loop.update as update
from mmrl.state import checkpoint
from mmrl.testing.bandit import BanditPolicy
from mmrl.testing.bandit import Config as BanditConfig
from mmrl.loop.ema import EMA, averaged_weights, build_ema
from mmrl.loop.trainer import setup

EMA_RUN = ["max_steps=6", "checkpoint.every=3", "eval.every=3", "train.ema_decay=0.9"]


def _ema(thetas0, decay, every=1, warmup=False):
    params = [torch.nn.Parameter(torch.tensor([t])) for t in thetas0]
    return EMA(params, decay, every, warmup), params


def _train(ema, params, thetas):
    """Set the weights to each row of `thetas` as an optimizer step would, then update; the averages after each."""
    seen = []
    for row in thetas:
        with torch.no_grad():
            for p, t in zip(params, row):
                p.fill_(t)
        ema.update()
        seen.append([float(bar) for bar in ema.shadow])
    return seen


# ---------------------------------------------------------------- the update rule


@pytest.mark.parametrize("decay, every, warmup, expected", [
    # bar_k = beta * bar + (1 - beta) * theta_k; two scalars, theta_0 = (0, 8), theta_k = (1, 0), (2, 0), (4, 0)
    (0.5, 1, False, [[0.5, 4.0], [1.25, 2.0], [2.625, 1.0]]),
    # warm-up: beta_1 = 2/11, beta_2 = 3/12, beta_3 = 4/13 (all below 0.5)
    (0.5, 1, True, [[9 / 11, 16 / 11], [75 / 44, 4 / 11], [471 / 143, 16 / 143]]),
    # every 2 steps: k = 1 and 3 change nothing; k = 2 averages theta_2 in, plain beta 0.5
    (0.5, 2, False, [[0.0, 8.0], [1.0, 4.0], [1.0, 4.0]]),
])
def test_update_rule_matches_a_hand_computed_table(decay, every, warmup, expected):
    ema, params = _ema([0.0, 8.0], decay, every, warmup)
    seen = _train(ema, params, [(1.0, 0.0), (2.0, 0.0), (4.0, 0.0)])
    assert seen == [pytest.approx(row, rel=1e-6) for row in expected]
    assert ema.steps == 3


def test_the_warm_up_caps_the_decay_at_1_plus_k_over_10_plus_k():
    """beta_k = min(beta, (1 + k) / (10 + k)): below the cap early, the configured decay once the cap passes it
    (Flow-GRPO's 0.9 is reached at k = 80); without warm-up always the configured decay."""
    ema, _ = _ema([0.0], 0.25, warmup=True)
    assert [ema.decay_at(k) for k in (1, 2, 3)] == [2 / 11, 0.25, 0.25]
    ema, _ = _ema([0.0], 0.9, warmup=True)
    assert ema.decay_at(79) == pytest.approx(80 / 89) and 80 / 89 < 0.9
    assert ema.decay_at(80) == pytest.approx(0.9) and ema.decay_at(500) == 0.9
    assert _ema([0.0], 0.9, warmup=False)[0].decay_at(1) == 0.9


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_average_is_an_fp32_copy_of_the_trainable_weights(dtype):
    p = torch.nn.Parameter(torch.tensor([1.5, -2.25], dtype=dtype))
    ema = EMA([p], 0.9)
    assert ema.shadow[0].dtype == torch.float32 and ema.shadow[0].device == p.device
    with torch.no_grad():
        p.add_(1.0)
    assert ema.shadow[0].tolist() == [1.5, -2.25]                  # a copy, not a view


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swapped_in_runs_on_the_average_and_restores_the_trained_weights_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 4, generator=gen).to(dtype)) for _ in range(2)]
    ema = EMA(params, 0.9, warmup=False)
    for _ in range(3):
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn(p.shape, generator=gen).to(dtype))
        ema.update()
    trained = [p.detach().clone() for p in params]
    with ema.swapped_in():
        assert all(torch.equal(p, bar.to(dtype)) for p, bar in zip(params, ema.shadow))
        assert not torch.equal(params[0], trained[0])
    assert all(torch.equal(p, t) for p, t in zip(params, trained))
    with pytest.raises(RuntimeError, match="boom"), ema.swapped_in():
        raise RuntimeError("boom")
    assert all(torch.equal(p, t) for p, t in zip(params, trained))
    assert all(p.requires_grad for p in params)


def test_averaged_weights_without_an_ema_leaves_the_weights_alone():
    p = torch.nn.Parameter(torch.tensor([3.0]))
    with averaged_weights(None):
        assert p.item() == 3.0
    assert build_ema([p], SimpleNamespace(ema_decay=0.0, ema_every=1, ema_warmup=True)) is None


def test_save_and_load_round_trip_and_refuse_other_shapes(tmp_path):
    ema, params = _ema([0.0, 8.0], 0.5)
    _train(ema, params, [(1.0, 0.0), (2.0, 0.0)])
    path = str(tmp_path / "ema.safetensors")
    ema.save(path)
    fresh, _ = _ema([5.0, 5.0], 0.5)
    fresh.load(path)
    assert fresh.steps == 2 and all(torch.equal(a, b) for a, b in zip(fresh.shadow, ema.shadow))
    other = EMA([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))], 0.5)
    with pytest.raises(ValueError, match="do not fit this policy's 2 trainable tensors"):
        other.load(path)


@pytest.mark.parametrize("grad, loss", [([math.nan], 1.0), ([1.0], math.inf)])
def test_a_skipped_optimizer_step_does_not_update_the_average(grad, loss):
    """A non-finite gradient or loss skips the optimizer step (mmrl/loop/update.py) and the EMA with it: neither its
    average nor its step count k moves; the next good step updates it as the first."""
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([w], lr=1.0)
    ema = EMA([w], 0.5, warmup=False)
    optim = SimpleNamespace(max_grad_norm=0.0, max_nonfinite_in_a_row=3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    counters = update.Counters()
    w.grad = torch.tensor(grad)
    update.optimizer_step([w], opt, sched, ema, optim, loss, counters)
    assert counters.skipped == 1 and ema.steps == 0 and ema.shadow[0].item() == 0.0
    w.grad = torch.tensor([-4.0])                                    # SGD, lr 1: w = 4
    update.optimizer_step([w], opt, sched, ema, optim, 1.0, counters)
    assert ema.steps == 1 and ema.shadow[0].item() == 2.0            # 0.5 * 0 + 0.5 * 4


# ---------------------------------------------------------------- in the trainer (the bandit policy)


def _without(prefixes, rows):
    return [{k: v for k, v in r.items() if not k.startswith(prefixes)} for r in rows]


def _without_time(rows):
    return _without(("time/", "mem/peak_"), rows)


def _record_eval_weights(monkeypatch, run) -> list:
    """(weights the evaluation generates from, the run's average then) at each evaluation."""
    seen, generate = [], BanditPolicy.generate_eval

    def recording(self, prompts):
        seen.append((self.net.theta.detach().clone(), run.ema.shadow[0].clone()))
        return generate(self, prompts)

    monkeypatch.setattr(BanditPolicy, "generate_eval", recording)
    return seen


def _bandit_policy(run):
    return BanditPolicy(BanditConfig(**{k: getattr(run.cfg.policy, k) for k in ("num_contexts", "num_arms",
                                                                              "num_actions")}), "cpu")


def test_evaluation_and_export_use_the_average_and_training_is_unchanged(tmp_path, monkeypatch, bandit_cfg,
                                                                         read_metrics, run_bandit):
    """With train.ema_decay=0.9 every evaluation generates from the average (the last one from the final
    average, not the trained weights); the trained weights, swapped back after each evaluation, follow
    exactly the run without an EMA; the checkpoint's policy_ema.safetensors loads as the average and
    policy.safetensors as the trained weights."""
    plain = run_bandit(tmp_path / "plain", *EMA_RUN[:-1])
    run = setup(bandit_cfg(tmp_path / "ema", *EMA_RUN))
    seen = _record_eval_weights(monkeypatch, run)
    run.fit()

    assert len(seen) == 3 and run.ema.steps == 12                    # evaluations at steps 0, 3, 6; 6 x 2 epochs
    assert all(torch.equal(used, average) for used, average in seen)
    assert torch.equal(seen[0][0], torch.zeros_like(seen[0][0]))     # the average starts at theta_0 (zeros)
    assert not torch.equal(seen[1][0], seen[2][0])
    assert torch.equal(seen[-1][0], run.ema.shadow[0]) and not torch.equal(seen[-1][0], run.params[0])
    assert torch.equal(run.params[0], plain.params[0])               # bit for bit: the swaps left no trace
    training = [_without(("time/", "mem/peak_", "eval/"), read_metrics(tmp_path / d)) for d in ("plain", "ema")]
    assert len(training[0]) == 7 and training[0] == training[1]

    ckpt = str(tmp_path / "ema" / "checkpoints" / "step_000006")
    fresh = _bandit_policy(run)
    fresh.load(os.path.join(ckpt, "policy_ema.safetensors"))
    assert torch.equal(fresh.net.theta, run.ema.shadow[0])
    fresh.load(os.path.join(ckpt, "policy.safetensors"))
    assert torch.equal(fresh.net.theta, run.params[0])


def test_decay_zero_keeps_no_average_and_writes_no_ema_files(tmp_path, run_bandit):
    run = run_bandit(tmp_path, *EMA_RUN[:-1])
    assert run.ema is None
    assert sorted(os.listdir(tmp_path / "checkpoints" / "step_000006")) == sorted(checkpoint.FILES)


def test_resume_with_an_ema_continues_bit_exactly(tmp_path, read_metrics, run_bandit):
    """Save at step 3, lose steps 4..6, resume: the metrics (the evaluation on the average included) and the
    step-6 files, the average's among them, are byte for byte those of the unbroken run."""
    run_bandit(tmp_path, *EMA_RUN)
    root = tmp_path / "checkpoints"
    names = ("policy.safetensors", "policy_ema.safetensors", "ema.safetensors")
    unbroken = {n: (root / "step_000006" / n).read_bytes() for n in names}
    full = _without_time(read_metrics(tmp_path))

    shutil.rmtree(root / "step_000006")
    (root / "latest").write_text("step_000003\n")
    run = run_bandit(tmp_path, *EMA_RUN, "resume=auto")

    assert run.ema.steps == 12
    assert _without_time(read_metrics(tmp_path)) == full
    assert {n: (root / "step_000006" / n).read_bytes() for n in names} == unbroken


def test_resuming_a_checkpoint_without_an_average_with_one_on_is_a_clear_error(tmp_path, bandit_cfg, run_bandit):
    """A checkpoint written without an EMA (here outside its run directory, so no config.yaml is compared)
    resumed with train.ema_decay > 0 stops at setup with a message naming the key and both ways out."""
    run_bandit(tmp_path / "plain", "max_steps=2", "eval.every=0")
    loose = tmp_path / "loose" / "step_000002"
    shutil.copytree(tmp_path / "plain" / "checkpoints" / "step_000002", loose)
    cfg = bandit_cfg(tmp_path / "new", "max_steps=4", "eval.every=0", "train.ema_decay=0.9", f"resume={loose}")
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as err:
        setup(cfg)
    assert str(err.value) == (f"config key 'train.ema_decay' is 0.9 but checkpoint {str(loose)!r} holds no "
                              "ema.safetensors (its run kept no EMA); resume it with train.ema_decay=0, or start "
                              "a new run in another output_dir")
