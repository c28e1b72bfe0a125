"""Group filters (none, dynamic, starpo) and group_spread, by hand."""

import json
import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.algorithms.filtering import FILTERS, group_spread

NAN = float("nan")


def T(rows):
    return torch.tensor(rows, dtype=torch.float32)


#   row 0: [1, 0, 0, 1]        unbiased std sqrt(1 / 3) = 0.5773503
#   row 1: [3, 3, 3, 3]        0
#   row 2: [nan, 2, 0, 1]      valid [2, 0, 1]: sum sq 2, var 1 -> 1
#   row 3: [nan, nan, 5, nan]  one valid -> 0
#   row 4: [0, 0, 0, 4]        sum sq 12, var 4 -> 2
#   row 5: all nan             0
#   row 6: [nan, 2, 2, nan]    two valid, equal -> 0
R = T([[1, 0, 0, 1], [3, 3, 3, 3], [NAN, 2, 0, 1], [NAN, NAN, 5, NAN], [0, 0, 0, 4], [NAN] * 4, [NAN, 2, 2, NAN]])


def test_group_spread_by_hand():
    torch.testing.assert_close(group_spread(R), T([0.5773503, 0, 1, 0, 2, 0, 0]), rtol=0, atol=1e-6)


def test_none_keeps_everything():
    assert FILTERS.resolve("none")(R, 0.5).tolist() == [True] * 7


def test_dynamic_drops_zero_spread_and_short_groups():
    assert FILTERS.resolve("dynamic")(R).tolist() == [True, False, True, False, True, False, False]


def test_dynamic_keeps_tiny_but_real_spread():
    assert FILTERS.resolve("dynamic")(T([[0.5, 0.5 + 1e-6], [NAN, 1.0]])).tolist() == [True, False]


def test_starpo_keeps_highest_spread():
    starpo = FILTERS.resolve("starpo")
    # spreads [0.577, 0, 1, 0, 2, 0, 0]; P = 7
    assert starpo(R, 0.25).tolist() == [False, False, True, False, True, False, False]   # ceil(1.75) = 2
    assert starpo(R, 3 / 7).tolist() == [True, False, True, False, True, False, False]   # ceil(3.0) = 3
    assert starpo(R, 1.0).tolist() == [True] * 7
    assert starpo(R, 0.01).tolist() == [False, False, False, False, True, False, False]  # at least one


def test_starpo_ceil_is_robust_to_float_products():
    # 0.6 * 5 = 3.0000000000000004 in floating point; ceil(0.6 * 5) is 3
    r = T([[0, 5], [0, 4], [0, 3], [0, 2], [0, 1]])
    assert FILTERS.resolve("starpo")(r, 0.6).tolist() == [True, True, True, False, False]
    # 0.7 * 10 = 7.000000000000001 -> 7
    r10 = T([[0, float(10 - i)] for i in range(10)])
    assert int(FILTERS.resolve("starpo")(r10, 0.7).sum()) == 7


def test_starpo_ties_by_index():
    # spreads [0.7071, 0.7071, 1.4142, 0.7071]: keep 2 -> row 2, then the first of the tied rows
    r = T([[0, 1], [1, 0], [0, 2], [5, 6]])
    assert FILTERS.resolve("starpo")(r, 0.5).tolist() == [True, False, True, False]
    # all tied: the first k by index
    assert FILTERS.resolve("starpo")(T([[1, 1]] * 5), 0.4).tolist() == [True, True, False, False, False]


@pytest.mark.parametrize("frac", [0.0, -0.1, 1.5, float("nan")])
def test_starpo_rejects_fraction_outside_unit_interval(frac):
    with pytest.raises(ValueError, match=r"algo.filter.keep_frac must be in \(0, 1\]"):
        FILTERS.resolve("starpo")(R, frac)


def test_unknown_filter_lists_names():
    with pytest.raises(KeyError, match="unknown group filter 'topk'.*dynamic, none, starpo"):
        FILTERS.resolve("topk", "algo.filter")


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.lists(st.sampled_from([0.0, 0.5, 1.0, NAN]), min_size=3, max_size=3), min_size=1, max_size=8),
       pct=st.integers(1, 100))
def test_starpo_count_and_order(rows, pct):
    r = T(rows)
    keep = FILTERS.resolve("starpo")(r, pct / 100)
    assert int(keep.sum()) == max(1, math.ceil(Fraction(pct, 100) * len(rows)))  # exact ceil
    spread = group_spread(r)
    if keep.any() and (~keep).any():
        assert spread[keep].min() >= spread[~keep].max()


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_every_filter_returns_bool_per_group(name):
    keep = FILTERS.resolve(name)(R, 0.5)
    assert keep.dtype == torch.bool and keep.shape == (R.shape[0],)


def test_best_and_worst_by_hand():
    from mmrl.algorithms.filtering import best_and_worst

    nan = float("nan")
    r = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7, 0.2],
                      [1.0, nan, 0.0, nan, nan, 0.5]])
    idx = best_and_worst(r, 2)
    assert idx[0].tolist() == [1, 4, 5, 0]          # 0.9, 0.7 | 0.2, 0.1
    assert idx[1].tolist() == [0, 5, 2, 1]          # only 3 valid: all of them, then an unscorable one
    with pytest.raises(ValueError, match="best_worst_k"):
        best_and_worst(r, 4)


def test_best_worst_k_in_training_keeps_2k_per_group(tmp_path, run_bandit, train_rows):
    run_bandit(tmp_path, "max_steps=3", "algo.best_worst_k=2", "logging.save_samples_every=1")
    rows = [json.loads(line) for line in open(tmp_path / "samples" / "step_000001.jsonl")]
    assert len(rows) == 4 * 4                        # P=4 groups x 2k=4
    assert len(train_rows(tmp_path)) == 3



def test_a_filter_registered_as_resampling_refills_the_step(tmp_path, run_bandit, train_rows):
    """The generator's extra rounds follow the filter's own registration, not its name: a user's filter that
    keeps half of each round's groups fills the step in two rounds; registered without resampling, in one."""
    from mmrl.algorithms.filtering import RESAMPLING, register

    def first_half(r, keep_frac=1.0):
        keep = torch.zeros(r.shape[0], dtype=torch.bool)
        keep[: r.shape[0] // 2] = True
        return keep

    try:
        register("first_half_refill", resamples=True)(first_half)
        register("first_half_once")(first_half)
        for name, rounds, kept in (("first_half_refill", 2, 4), ("first_half_once", 1, 2)):
            run_bandit(tmp_path / name, f"algo.filter.name={name}", "max_steps=1", "train.prompts_per_step=4",
                       "eval.every=0")
            row = train_rows(tmp_path / name)[0]
            assert (row["filter/rounds"], row["filter/kept_groups"]) == (rounds, kept), name
    finally:
        for name in ("first_half_refill", "first_half_once"):
            FILTERS.pop(name, None)
            RESAMPLING.discard(name)
