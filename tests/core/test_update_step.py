"""The learner's optimizer step (`mmrl.loop.update.optimizer_step`) in isolation: grad-norm clipping, skipping non-finite steps and the
streak that stops a run; and the step totals of the loss normaliser across processes."""

import math
from types import SimpleNamespace

import pytest
import torch

import mmrl.loop.update as update
from mmrl.algorithms.losses import Normalizer


def _run(max_grad_norm: float, max_in_a_row: int = 3, lr: float = 1.0):
    w = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([w], lr=lr)
    optim = SimpleNamespace(max_grad_norm=max_grad_norm, max_nonfinite_in_a_row=max_in_a_row)
    parts = SimpleNamespace(optim=optim, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0))
    return parts, w


def _step(run, w, grad, loss=1.0, counters=None):
    w.grad = torch.tensor(grad)
    counters = counters if counters is not None else update.Counters()
    return update.optimizer_step([w], run.optimizer, run.scheduler, None, run.optim, loss, counters), counters


@pytest.mark.parametrize("max_grad_norm, moved", [(0.0, [3.0, 4.0]), (0.5, [0.3, 0.4]), (2.0, [1.2, 1.6]),
                                                  (10.0, [3.0, 4.0])])
def test_grad_norm_is_clipped_to_max_grad_norm_and_reported_before_clipping(max_grad_norm, moved):
    """A gradient of norm 5 moves the weights (SGD, lr 1) by the gradient scaled to max_grad_norm when it is
    smaller (0.5 and 2.0, also below 1), unclipped when it is larger or 0 (no clipping); the reported norm
    is the one before clipping, and the gradient is cleared after the step."""
    run, w = _run(max_grad_norm)
    norm, counters = _step(run, w, [3.0, 4.0])
    assert norm == pytest.approx(5.0)
    torch.testing.assert_close(-w.detach(), torch.tensor(moved))
    assert w.grad is None and counters == update.Counters()


@pytest.mark.parametrize("grad, loss", [([math.nan, 0.0], 1.0), ([math.inf, 0.0], 1.0), ([1.0, 0.0], math.inf),
                                        ([1.0, 0.0], math.nan)])
def test_a_non_finite_gradient_or_loss_skips_the_step(grad, loss):
    """Either a non-finite gradient norm or a non-finite loss (with a finite gradient) skips the step: the
    weights stay, the gradient is dropped, and the skip is counted."""
    run, w = _run(1.0)
    _, counters = _step(run, w, grad, loss)
    assert torch.equal(w.detach(), torch.zeros(2)) and w.grad is None
    assert counters == update.Counters(skipped=1, streak=1)


def test_the_non_finite_streak_resets_on_a_good_step_and_stops_at_the_limit():
    """skipped counts every skipped step; streak counts them in a row, is reset by a finite step, and
    reaching optim.max_nonfinite_in_a_row raises NonFiniteError naming the key."""
    run, w = _run(1.0, max_in_a_row=3)
    counters = update.Counters()
    seen = []
    for loss in (math.nan, math.nan, 1.0, math.nan, math.nan):
        _step(run, w, [0.1, 0.0], loss, counters)
        seen.append(counters.state_dict())
    assert seen == [{"skipped": 1, "streak": 1}, {"skipped": 2, "streak": 2}, {"skipped": 2, "streak": 0},
                    {"skipped": 3, "streak": 1}, {"skipped": 4, "streak": 2}]
    with pytest.raises(update.NonFiniteError, match=r"3 optimizer steps in a row .*max_nonfinite_in_a_row=3\); "
                                                    r"stopping\. The last checkpoint is intact; try a lower "
                                                    r"optim\.lr or optim\.max_grad_norm\.$"):
        _step(run, w, [0.1, 0.0], math.nan, counters)


def test_normalizer_sums_the_step_over_processes_and_divides_by_their_number(monkeypatch):
    """With two processes (faked: each sees the same microbatch) the normaliser holds the totals of both
    (sequences and actions summed, not averaged) and the world size, so each process's share of the loss
    is half the one-process loss and their summed gradients equal its gradient."""
    def two_ranks(values, op="sum"):
        factor = {"sum": 2.0, "mean": 1.0, "max": 1.0, "min": 1.0}[op]     # KeyError for any other op
        return [factor * v for v in values]

    monkeypatch.setattr(update, "all_reduce", two_ranks)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert update._normalizer(mask, None, 2) == Normalizer(4.0, 6.0, 3.0, 2)
    assert update._normalizer(mask, 8, 2) == Normalizer(4.0, 6.0, 8.0, 2)


def _bandit_step(bandit_cfg, tmp_path, n_prompts: int, *overrides):
    from mmrl.loop.collect import StepBatch
    from mmrl.loop.trainer import setup
    from mmrl.types import PromptBatch, select

    run = setup(bandit_cfg(tmp_path, "eval.every=0", "checkpoint.every=0", *overrides))
    k = max(n_prompts, 1)
    ro = run.policy.rollout(PromptBatch(rows=run.records[:k], index=list(range(k)), seeds=list(range(k)), step=0),
                            group_size=2)
    ro = select(ro, torch.arange(2 * n_prompts))
    n = len(ro)
    return run, StepBatch(ro, torch.zeros(n, 1), torch.zeros(n), torch.linspace(-1, 1, n), {})


def test_update_skips_an_empty_batch_and_trains_a_batch_of_one_group(tmp_path, bandit_cfg):
    """An empty step batch (every group filtered out) reports update/skipped_empty = 1 and changes nothing;
    a batch of a single group trains (loss and grad_norm reported)."""
    run, empty = _bandit_step(bandit_cfg, tmp_path / "a", 0)
    before = [p.detach().clone() for p in run.params]
    metrics = run.learner.update(empty, 1)
    assert list(metrics) == ["update/skipped_empty"] and metrics["update/skipped_empty"].value == 1
    assert all(torch.equal(a, b) for a, b in zip(before, run.params, strict=True))
    run, one = _bandit_step(bandit_cfg, tmp_path / "b", 1)
    metrics = run.learner.update(one, 1)
    assert "update/skipped_empty" not in metrics and metrics["grad_norm"].value > 0
    assert metrics["optim/lr"].value == pytest.approx(run.scheduler.get_last_lr()[0])


def test_samples_per_optimizer_step():
    """samples_per_microbatch * grad_accum_steps, down to a single sample; all of them with accumulation 0."""
    def per_opt(mb, accum, n):
        return update.samples_per_optimizer_step(SimpleNamespace(samples_per_microbatch=mb, grad_accum_steps=accum), n)

    assert (per_opt(1, 1, 8), per_opt(2, 3, 8), per_opt(4, 0, 8)) == (1, 6, 8)


def test_update_shuffles_microbatches_with_its_own_seeded_generator(tmp_path, bandit_cfg):
    """The microbatch order comes from a generator seeded by (seed, step), not from the global RNG: the same
    step trains bit for bit the same whatever the global RNG state is."""
    results = []
    for draw in (0, 5):
        run, batch = _bandit_step(bandit_cfg, tmp_path / f"r{draw}", 4, "train.samples_per_microbatch=2",
                                  "train.grad_accum_steps=1", "train.update_epochs=2")
        torch.manual_seed(draw)
        run.learner.update(batch, 3)
        results.append([p.detach().clone() for p in run.params])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_counters_round_trip_through_a_checkpoint_mapping_and_refuse_unknown_ones():
    counters = update.Counters(skipped=3, streak=1)
    again = update.Counters()
    again.load_state_dict(counters.state_dict())                   # what state.json holds
    assert again == counters and counters.state_dict() == {"skipped": 3, "streak": 1}
    with pytest.raises(ValueError, match=r"checkpoint counters \['bogus'\] are not counters of this version"):
        again.load_state_dict({"bogus": 1})
