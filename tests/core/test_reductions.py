"""Declared metric reductions (mmrl.distributed.reduce): hand-computed tables over microbatches, the
scorer's metrics at the core boundary, the weighted reward total, the optimizer-step
batch size, and a two-process (gloo) run of the process reduction.

Run as a script (`python test_reductions.py OUT`, under RANK / WORLD_SIZE / MASTER_* env
variables) it is the worker of the two-process test.
"""

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from mmrl.algorithms.advantages import weighted_total
from mmrl.loop.collect import declare_reward_metrics
from mmrl.algorithms.losses import clipped_surrogate
from mmrl.distributed.reduce import Accumulator, Metric, maximum, mean, minimum, summed, weighted_mean
from mmrl.loop.update import samples_per_optimizer_step

NAN = float("nan")


def merged(*microbatches) -> dict:
    acc = Accumulator()
    for m in microbatches:
        acc.add(m)
    return acc.result()


# ---------------------------------------------------------------- microbatch tables

@pytest.mark.parametrize("declare, values, expected", [
    (mean, [1.0, 2.0, 6.0], 3.0),                    # (1 + 2 + 6) / 3
    (summed, [1, 0, 2], 3),                          # a count stays an int
    (maximum, [0.1, 0.7, 0.3], 0.7),
    (minimum, [0.1, 0.7, 0.3], 0.1),
    (maximum, [0.1, NAN, 0.3], NAN),                 # a NaN wins whatever its position
])
def test_unweighted_reductions(declare, values, expected):
    out = merged(*({"x": declare(v)} for v in values))["x"]
    assert (math.isnan(out) and math.isnan(expected)) or out == expected
    assert type(out) is type(expected)


def test_weighted_mean_weighs_by_tokens():
    # fractions 0.5 of 2 tokens, 0.25 of 4 tokens, 1.0 of 2 tokens: (1 + 1 + 2) / 8 = 0.5
    # (the plain mean of the three would be 0.5833)
    parts = [(0.5, 2), (0.25, 4), (1.0, 2)]
    assert merged(*({"f": weighted_mean(v, n)} for v, n in parts))["f"] == pytest.approx(0.5)


def test_weighted_mean_leaves_out_contributions_that_counted_nothing():
    assert merged({"r": weighted_mean(NAN, 0)}, {"r": weighted_mean(0.4, 3)})["r"] == pytest.approx(0.4)
    assert math.isnan(merged({"r": weighted_mean(NAN, 0)})["r"])
    assert math.isnan(merged({"r": mean(NAN)}, {"r": mean(1.0)})["r"])   # a plain mean keeps the NaN


def test_tensor_values_and_mixed_int_float():
    out = merged({"k": mean(torch.tensor(2.0)), "n": mean(4)}, {"k": mean(torch.tensor(4.0)), "n": mean(4)})
    assert out == {"k": 3.0, "n": 4} and type(out["n"]) is int
    assert type(merged({"s": summed(1)}, {"s": summed(0.5)})["s"]) is float


def test_merging_a_merged_state_equals_merging_everything():
    # microbatches of one process, then its merged state with another process's
    a = [{"m": mean(1.0), "w": weighted_mean(0.5, 2), "s": summed(1), "x": maximum(3.0)},
         {"m": mean(3.0), "w": weighted_mean(0.0, 6), "s": summed(2), "x": maximum(1.0)}]
    b = [{"m": mean(5.0), "w": weighted_mean(1.0, 2), "s": summed(4), "x": maximum(2.0)}]
    state = Accumulator()
    for m in a:
        state.add(m)
    two_level = merged(state.metrics(), *b)
    assert two_level == merged(*a, *b) == {"m": 3.0, "w": pytest.approx(3 / 10), "s": 7, "x": 3.0}


def test_undeclared_and_conflicting_metrics_are_errors():
    with pytest.raises(TypeError, match="'loss' is a float; declare its reduction"):
        Accumulator().add({"loss": 1.0})
    with pytest.raises(ValueError, match="'x' is declared with reduction 'max' here and 'mean' before"):
        Accumulator().add({"x": mean(1.0)}).add({"x": maximum(2.0)})
    with pytest.raises(ValueError, match="unknown metric reduction 'median'"):
        Metric(1.0, "median")


def test_clip_frac_over_microbatches_is_the_fraction_over_all_tokens():
    # microbatch 1: 1 valid action of ratio 1.5 (clipped, A > 0); microbatch 2: 3 valid actions
    # of ratio 1.0 (not clipped). Over all 4 actions 1/4 is clipped; per-microbatch
    # averaging would say (1 + 0) / 2.
    kw = dict(clip_low=0.2, clip_high=0.2)
    _, m1 = clipped_surrogate(torch.log(torch.tensor([[1.5, 1.0, 1.0]])), torch.zeros(1, 3),
                              torch.tensor([1.0]), torch.tensor([[1.0, 0, 0]]), **kw)
    _, m2 = clipped_surrogate(torch.zeros(1, 3), torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3), **kw)
    out = merged(m1, m2)
    assert out["clip_frac"] == pytest.approx(0.25)
    assert out["ratio/mean"] == pytest.approx((1.5 + 3 * 1.0) / 4)
    assert out["ratio/max_abs_dev"] == pytest.approx(0.5)


# ---------------------------------------------------------------- scorer boundary, totals, sizes

def test_scorer_metrics_declared_at_the_boundary():
    scores = torch.tensor([[1.0, NAN], [0.0, NAN], [NAN, NAN]])          # [N=3, K=2]
    raw = {"reward/a/mean": 0.5, "reward/a/failed": 1, "reward/b/mean": NAN, "reward/b/failed": 3}
    out = declare_reward_metrics(raw, scores, ["a", "b"])
    assert out["reward/a/failed"] == summed(1) and out["reward/b/failed"] == summed(3)
    assert out["reward/a/mean"] == weighted_mean(0.5, 2)                 # 2 samples scored
    assert out["reward/b/mean"].weight == 0                              # none scored
    with pytest.raises(RuntimeError, match=r"\['reward/a/median'\] have no declared reduction"):
        declare_reward_metrics({**raw, "reward/a/median": 0.5}, scores, ["a", "b"])


def test_weighted_total_table_and_nan():
    scores = torch.tensor([[1.0, 0.5], [0.0, 1.0], [NAN, 1.0]])          # [N=3, K=2]
    total = weighted_total(scores, [2.0, -1.0])                          # [3]
    assert total[:2].tolist() == [1.5, -1.0] and math.isnan(total[2])
    with pytest.raises(ValueError, match="2 reward columns but 1 weights"):
        weighted_total(scores, [1.0])


@pytest.mark.parametrize("mb, accum, n, expected", [(8, 0, 32, 32), (8, 2, 32, 16), (3, 4, 10, 12)])
def test_samples_per_optimizer_step(mb, accum, n, expected):
    train = SimpleNamespace(samples_per_microbatch=mb, grad_accum_steps=accum)
    assert samples_per_optimizer_step(train, n) == expected


# ---------------------------------------------------------------- two processes

# per rank: two microbatches of update metrics, then the scorer's metrics of its samples
RANK_ROWS = {
    0: ([{"clip_frac": weighted_mean(0.5, 2), "loss": mean(1.0), "ratio/max_abs_dev": maximum(0.2)},
         {"clip_frac": weighted_mean(0.0, 2), "loss": mean(3.0), "ratio/max_abs_dev": maximum(0.1)}],
        torch.tensor([[1.0], [0.0], [NAN]]), {"reward/a/mean": 0.5, "reward/a/failed": 1}),
    1: ([{"clip_frac": weighted_mean(1.0, 4), "loss": mean(5.0), "ratio/max_abs_dev": maximum(0.7)}],
        torch.tensor([[NAN], [NAN], [NAN]]), {"reward/a/mean": NAN, "reward/a/failed": 3}),
}
# clip_frac (0.5*2 + 0*2 + 1*4) / 8; loss (1 + 3 + 5) / 3 (every optimizer step once);
# reward/a/mean over the 2 scored samples of rank 0 only; failed 1 + 3
EXPECTED = {"clip_frac": 0.625, "loss": 3.0, "ratio/max_abs_dev": 0.7, "reward/a/mean": 0.5, "reward/a/failed": 4}


def _worker(out: str) -> None:
    import torch.distributed as dist

    from mmrl.loop.trainer import _reduce_metrics

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    micro, scores, raw = RANK_ROWS[rank]
    update_metrics = Accumulator()
    for m in micro:
        update_metrics.add(m)
    row = {**update_metrics.metrics(), **declare_reward_metrics(raw, scores, ["a"])}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(_reduce_metrics(row), f)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.integration
def test_two_processes_combine_by_declared_reduction(tmp_path, free_port):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    out = str(tmp_path / "row")
    procs = [subprocess.Popen([sys.executable, __file__, out], env={**env, "RANK": str(r)},
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    rows = [json.load(open(f"{out}.{r}")) for r in range(2)]
    assert rows[0] == rows[1]                                        # every rank logs the same row
    assert rows[0] == pytest.approx(EXPECTED)
    assert type(rows[0]["reward/a/failed"]) is int


if __name__ == "__main__":
    _worker(sys.argv[1])
