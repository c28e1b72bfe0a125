"""Group advantage estimators and `combine`: hand-computed tables and properties.

Conventions under test (documented in mmrl/algorithms/advantages.py's module docstring): std is torch's
unbiased std (divide by n - 1) over the group's valid rewards, `eps` is added to the std
(not to the variance); NaN rewards are left out of the statistics and get 0; a group with
fewer than two valid rewards or all-equal valid rewards gets 0 everywhere.
"""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mmrl.algorithms.advantages import ESTIMATORS, combine, dr_grpo, grpo, grpo_batch_std, reinforce_pp, rloo, weighted_total

NAN = float("nan")
FAST = settings(max_examples=60, deadline=None)


def T(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, atol=1e-5):
    torch.testing.assert_close(actual, T(expected) if not isinstance(expected, torch.Tensor) else expected,
                               rtol=0, atol=atol, equal_nan=False)


# Shared [P=5, G=4] table.
#   row 0: [1, 0, 0, 1]        mean 0.5, dev +-0.5, sum sq 1, unbiased var 1/3, std 0.5773503
#   row 1: [3, 3, 3, 3]        zero spread -> 0
#   row 2: [nan, 2, 0, 1]      valid [2, 0, 1]: mean 1, dev [1, -1, 0], sum sq 2, var 2/2 = 1, std 1
#   row 3: [nan, nan, 5, nan]  one valid reward -> 0
#   row 4: [0, 0, 0, 4]        mean 1, dev [-1, -1, -1, 3], sum sq 12, var 12/3 = 4, std 2
TABLE = [[1, 0, 0, 1], [3, 3, 3, 3], [NAN, 2, 0, 1], [NAN, NAN, 5, NAN], [0, 0, 0, 4]]


def test_grpo_table():
    a = grpo(T(TABLE))  # eps = 1e-6 shifts these by < 2e-6
    s = 0.5 / 0.5773503  # 0.8660254
    close(a, [[s, -s, -s, s],
              [0, 0, 0, 0],
              [0, 1, -1, 0],
              [0, 0, 0, 0],
              [-0.5, -0.5, -0.5, 1.5]])


def test_grpo_unbiased_std_and_eps_in_denominator():
    # [0, 1, 2]: mean 1, sum sq 2, unbiased var 2/2 = 1 -> std 1; eps = 0.5 -> A = dev / 1.5.
    # (biased std sqrt(2/3) would give 1.2247 at the ends; sqrt(var + eps) would give 0.8165.)
    a = grpo(T([[0, 1, 2]]), eps=0.5)
    close(a, [[-2 / 3, 0, 2 / 3]], atol=1e-6)
    # G = 2: [0, 2]: mean 1, var (1 + 1) / 1 = 2, std 1.4142136; eps 0 -> +-0.7071068
    close(grpo(T([[0, 2]]), eps=0.0), [[-0.7071068, 0.7071068]], atol=1e-6)


def test_dr_grpo_table():
    close(dr_grpo(T(TABLE)), [[0.5, -0.5, -0.5, 0.5],
                              [0, 0, 0, 0],
                              [0, 1, -1, 0],
                              [0, 0, 0, 0],
                              [-1, -1, -1, 3]], atol=1e-6)


def test_rloo_table():
    # A_i = r_i - mean of the other valid rewards of its group:
    #   row 0: 1 - mean(0, 0, 1) = 2/3;  0 - mean(1, 0, 1) = -2/3
    #   row 2: 2 - mean(0, 1) = 1.5;  0 - mean(2, 1) = -1.5;  1 - mean(2, 0) = 0
    #   row 4: 0 - mean(0, 0, 4) = -4/3;  4 - mean(0, 0, 0) = 4
    close(rloo(T(TABLE)), [[2 / 3, -2 / 3, -2 / 3, 2 / 3],
                           [0, 0, 0, 0],
                           [0, 1.5, -1.5, 0],
                           [0, 0, 0, 0],
                           [-4 / 3, -4 / 3, -4 / 3, 4]], atol=1e-6)


def test_reinforce_pp_table():
    # group-centred values of the kept entries (valid, in groups with signal):
    #   row 0 [.5, -.5, -.5, .5], row 2 [1, -1, 0] (columns 1..3), row 4 [-1, -1, -1, 3]
    # 11 values, mean 0, sum sq 1 + 2 + 12 = 15, unbiased var 15 / 10 = 1.5, std 1.2247449
    s = 1.2247449
    close(reinforce_pp(T(TABLE)), [[0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s],
                                   [0, 0, 0, 0],
                                   [0, 1 / s, -1 / s, 0],
                                   [0, 0, 0, 0],
                                   [-1 / s, -1 / s, -1 / s, 3 / s]])


def test_grpo_batch_std_table():
    # valid values over the batch [0, 2, 1, 1, 1]: mean 1, sum sq 2, population var 2 / 5 = 0.4 (Flow-GRPO's
    # np.std, no Bessel correction), std 0.6324555
    # row 0: group mean 1 -> [-1, 1] / 0.6324555; the NaN gets 0; row 1 has no signal -> 0
    a = grpo_batch_std(T([[0, 2, NAN], [1, 1, 1]]))
    close(a, [[-1.5811388, 1.5811388, 0], [0, 0, 0]])


# ---------------------------------------------------------------- every estimator

@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_contract(name):
    fn = ESTIMATORS.resolve(name)
    r = T([[1, 0, 0, 1],          # signal
           [2, 2, 2, 2],          # zero spread
           [NAN, 0.5, 1.5, NAN],  # signal with NaNs
           [NAN, 7, NAN, NAN],    # one valid
           [NAN, NAN, NAN, NAN],  # none valid
           [-1, -1, NAN, -1]])    # zero spread with a NaN
    a = fn(r, eps=1e-6)
    assert a.shape == r.shape
    assert torch.isfinite(a).all()
    assert (a[[1, 3, 4, 5]] == 0).all()
    assert (a[torch.isnan(r)] == 0).all()
    assert (a[0] != 0).any() and (a[2, 1:3] != 0).all()


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimator_all_groups_without_signal(name):
    a = ESTIMATORS.resolve(name)(T([[1, 1], [0, 0], [NAN, 3]]))
    assert a.shape == (3, 2) and (a == 0).all()


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(KeyError, match="unknown advantage estimator 'gae'.*valid names: dr_grpo, grpo"):
        ESTIMATORS.resolve("gae", "algo.advantage")
    with pytest.raises(KeyError, match="algo.advantage"):
        combine(T([[1], [0]]), [1.0], group_size=2, estimator="gae", mode="reward_sum")


# ---------------------------------------------------------------- combine
# N = 6 samples, G = 3, K = 2 rewards, weights [1.0, 0.5], estimator dr_grpo (A = r - mean).
#          reward 0   reward 1   total = r0 + 0.5 r1
#   s0        1          0          1
#   s1        0          2          1
#   s2        2          4          4
#   s3       nan         4         nan
#   s4        1          0          1
#   s5        3          2          4
SCORES = [[1, 0], [0, 2], [2, 4], [NAN, 4], [1, 0], [3, 2]]


def test_combine_reward_sum():
    # group 0 totals [1, 1, 4], mean 2 -> [-1, -1, 2]
    # group 1 totals [nan, 1, 4]: s3 unscorable -> 0; valid mean 2.5 -> [0, -1.5, 1.5]
    adv, total = combine(T(SCORES), [1.0, 0.5], group_size=3, estimator="dr_grpo", mode="reward_sum")
    close(adv, [-1, -1, 2, 0, -1.5, 1.5], atol=1e-6)
    torch.testing.assert_close(total, T([1, 1, 4, NAN, 1, 4]), equal_nan=True)


def test_combine_advantage_sum():
    # reward 0: group 0 [1, 0, 2] mean 1 -> [0, -1, 1]; group 1 [nan, 1, 3] mean 2 -> [0, -1, 1]
    # reward 1: group 0 [0, 2, 4] mean 2 -> [-2, 0, 2]; group 1 [4, 0, 2] mean 2 -> [2, -2, 0]
    # 1.0 * A0 + 0.5 * A1: group 0 [-1, -1, 2]; group 1 [0 + 1, -1 - 1, 1 + 0] = [1, -2, 1]
    # (s3's NaN only zeroes its own reward-0 term: it keeps 0.5 * 2 = 1)
    adv, total = combine(T(SCORES), [1.0, 0.5], group_size=3, estimator="dr_grpo", mode="advantage_sum")
    close(adv, [-1, -1, 2, 1, -2, 1], atol=1e-6)
    assert torch.isnan(total[3]) and total[5] == 4


def test_combine_advantage_sum_grpo():
    # grpo per reward, G = 2, weights [2, 1]:
    #   reward 0 [0, 1]: dev +-0.5, std 0.7071068 -> [-0.7071068, 0.7071068]
    #   reward 1 [3, 3]: no signal -> 0
    # 2 * A0 + 1 * A1 = [-1.4142136, 1.4142136]
    adv, _ = combine(T([[0, 3], [1, 3]]), [2.0, 1.0], group_size=2, estimator="grpo", mode="advantage_sum")
    close(adv, [-1.4142136, 1.4142136])


def test_combine_clip():
    adv, _ = combine(T(SCORES), [1.0, 0.5], group_size=3, estimator="dr_grpo", mode="advantage_sum", clip=1.5)
    close(adv, [-1, -1, 1.5, 1, -1.5, 1], atol=1e-6)
    adv, _ = combine(T(SCORES), [1.0, 0.5], group_size=3, estimator="dr_grpo", mode="reward_sum", clip=1.0)
    close(adv, [-1, -1, 1, 0, -1, 1], atol=1e-6)


def test_combine_errors():
    s = T(SCORES)
    with pytest.raises(ValueError, match="algo.reward_combine.*'mean'.*advantage_sum, reward_sum"):
        combine(s, [1.0, 0.5], group_size=3, estimator="grpo", mode="mean")
    with pytest.raises(ValueError, match="2 reward columns but 3 weights"):
        combine(s, [1.0, 0.5, 1.0], group_size=3, estimator="grpo", mode="reward_sum")
    with pytest.raises(ValueError, match="6 samples do not split into groups of 4"):
        combine(s, [1.0, 0.5], group_size=4, estimator="grpo", mode="reward_sum")
    with pytest.raises(ValueError, match=r"algo\.advantage.*grpo"):
        combine(s, [1.0, 0.5], group_size=3, estimator="ppo", mode="reward_sum")
    with pytest.raises(ValueError, match="^2 reward columns but 1 weights$"):
        weighted_total(s, [1.0])


@pytest.mark.parametrize("mode", ["reward_sum", "advantage_sum"])
def test_combine_passes_eps_and_stays_fp32(mode):
    """combine hands its eps to the estimator (a large eps visibly shrinks GRPO advantages) and computes in
    fp32 whatever torch's default dtype is."""
    s = T(SCORES)
    big = combine(s, [1.0, 0.5], group_size=3, estimator="grpo", mode=mode, eps=10.0)[0]
    small = combine(s, [1.0, 0.5], group_size=3, estimator="grpo", mode=mode)[0]
    if mode == "reward_sum":
        total = s[:, 0] + 0.5 * s[:, 1]
        close(big.view(2, 3), grpo(total.view(2, 3), eps=10.0))
    assert big.abs().max() < 0.5 * small.abs().max()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        adv, total = combine(s, [1.0, 0.5], group_size=3, estimator="grpo", mode=mode)
        assert adv.dtype == total.dtype == weighted_total(s, [1.0, 0.5]).dtype == torch.float32
    finally:
        torch.set_default_dtype(default)


# ---------------------------------------------------------------- properties
# Rewards on the grid k/8, |r| <= 8: exact in float32, so sums are exact and two distinct
# rewards stay distinct after a shift or a scaling (the signal test is unaffected).

GRID = st.integers(-64, 64).map(lambda k: k / 8)
CELL = st.one_of(GRID, GRID, GRID, st.just(NAN))


@st.composite
def tables(draw, nan=True):
    p, g = draw(st.integers(1, 4)), draw(st.integers(2, 6))
    cell = CELL if nan else GRID
    return T(draw(st.lists(st.lists(cell, min_size=g, max_size=g), min_size=p, max_size=p)))


@FAST
@given(r=tables(), shift=GRID, name=st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_shift_invariance(r, shift, name):
    # the mean (|mean| <= 8) is rounded to ~5e-7; divided by std >= 0.05 -> < 1e-4
    fn = ESTIMATORS.resolve(name)
    torch.testing.assert_close(fn(r + shift), fn(r), rtol=0, atol=1e-4)


@FAST
@given(r=tables(), c=st.floats(0.25, 8.0))
def test_scaling(r, c):
    # exact identity: (c dev) / (c std + eps) = dev / (std + eps / c)
    torch.testing.assert_close(grpo(r * c, eps=1e-6), grpo(r, eps=1e-6 / c), rtol=1e-5, atol=1e-5)
    # invariance up to eps: |dA| <= |A| * |eps - eps / c| / std <= 2.1 * 4e-6 / 0.05 ~ 2e-4
    torch.testing.assert_close(grpo(r * c), grpo(r), rtol=0, atol=1e-3)
    # dr_grpo is homogeneous of degree 1
    torch.testing.assert_close(dr_grpo(r * c), c * dr_grpo(r), rtol=1e-5, atol=1e-5 * c)


@FAST
@given(r=tables())
def test_grpo_group_sums_to_zero(r):
    a = grpo(r)
    # each dev carries < 1e-6 rounding, n <= 6 of them, divided by std >= 0.05 -> < 1.2e-4
    torch.testing.assert_close(a.sum(1), torch.zeros(r.shape[0]), rtol=0, atol=5e-4)


def _rloo_loop(r):
    out = torch.zeros_like(r)
    for p in range(r.shape[0]):
        idx = [i for i in range(r.shape[1]) if not math.isnan(float(r[p, i]))]
        vals = [float(r[p, i]) for i in idx]
        if len(vals) < 2 or max(vals) == min(vals):
            continue
        for i in idx:
            others = [float(r[p, j]) for j in idx if j != i]
            out[p, i] = float(r[p, i]) - sum(others) / len(others)
    return out


@FAST
@given(r=tables())
@example(r=T([[1, NAN, 0, 0]]))
def test_rloo_is_leave_one_out(r):
    torch.testing.assert_close(rloo(r), _rloo_loop(r), rtol=0, atol=1e-4)


@FAST
@given(r=tables())
def test_nan_entries_get_zero_and_do_not_change_the_others(r):
    # filling NaN slots with a fresh NaN-free group is not the same, but removing them is:
    # the advantage of a valid entry depends only on the valid entries of its group.
    for name in ("grpo", "dr_grpo", "rloo"):
        fn = ESTIMATORS.resolve(name)
        a = fn(r)
        assert (a[torch.isnan(r)] == 0).all()
        for p in range(r.shape[0]):
            valid = ~torch.isnan(r[p])
            if valid.sum() >= 2:
                sub = fn(r[p][valid][None, :])[0]
                torch.testing.assert_close(a[p][valid], sub, rtol=0, atol=1e-5)


def test_reinforce_pp_whitens_two_values_and_adds_eps_to_the_std():
    """Two kept values are enough to whiten (unbiased std of [-d, d] is d sqrt 2), and eps is added to
    the std: rewards of spread 2e-3 with eps 1e-4 give +-1e-3 / (1.41421e-3 + 1e-4), not / (std - eps)."""
    d, eps = 1e-3, 1e-4
    std = d * 2 ** 0.5
    close(reinforce_pp(T([[0.0, 2 * d]]), eps=eps), [[-d / (std + eps), d / (std + eps)]], atol=1e-7)
