"""Clipped surrogate, aggregation, Normalizer, KL estimators and policy_loss (mmrl/algorithms/losses.py).

Hand-computed tables; ratios are built as logp = log(ratio), old = 0. The clip-fraction metrics also at their
edges: all-zero advantages (nothing can be clipped, and the fractions are 0, not NaN), an all-masked microbatch,
and clip-higher (eps_low != eps_high) tables where each token is clipped on a known side or not at all; and the
LossSpec the update builds from the `algo:` config keys.
"""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mmrl.algorithms.losses import (AGGREGATIONS, KL_ESTIMATORS, LossSpec, Normalizer, aggregate, clipped_surrogate,
                         kl_estimate, kl_k1, kl_k2, kl_k3, policy_loss)
from mmrl.algorithms.objectives.pg import loss_spec
from mmrl.config import load_config
from mmrl.distributed.reduce import Accumulator, Metric
from mmrl.types import Scores

FAST = settings(max_examples=50, deadline=None)


def T(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, atol=1e-5):
    actual = actual.value if isinstance(actual, Metric) else actual      # losses declare their metrics
    exp = expected if isinstance(expected, torch.Tensor) else T(expected)
    torch.testing.assert_close(actual.float(), exp, rtol=0, atol=atol)


def log_ratio(ratios):
    return torch.log(T(ratios))


# ---------------------------------------------------------------- clipped surrogate

def test_surrogate_table_asymmetric_clip():
    # clip_low 0.2, clip_high 0.28: ratio clipped into [0.8, 1.28]; l = max(-r A, -clip(r) A)
    # row 0, A = +2: r 1.1 -> -2.2 (inside); 1.5 -> -2 * 1.28 = -2.56 (clipped high);
    #                r 0.5 -> max(-1.0, -1.6) = -1.0 (A > 0: no clipping below); 1.25 -> -2.5 (inside)
    # row 1, A = -1: r 1.5 -> max(1.5, 1.28) = 1.5 (A < 0: no clipping above); 0.5 -> max(0.5, 0.8) = 0.8
    #                (clipped low); 0.9 -> 0.9 (inside); 0.75 -> 0.8 (clipped low)
    logp = log_ratio([[1.1, 1.5, 0.5, 1.25], [1.5, 0.5, 0.9, 0.75]])
    l, m = clipped_surrogate(logp, torch.zeros(2, 4), T([2, -1]), torch.ones(2, 4), clip_low=0.2, clip_high=0.28)
    close(l, [[-2.2, -2.56, -1.0, -2.5], [1.5, 0.8, 0.9, 0.8]])
    close(m["clip_frac"], 3 / 8)
    close(m["clip_frac/high"], 1 / 8)
    close(m["clip_frac/low"], 2 / 8)
    close(m["clip_frac/dual"], 0.0)
    # (1.1 + 1.5 + 0.5 + 1.25 + 1.5 + 0.5 + 0.9 + 0.75) / 8 = 8.0 / 8
    close(m["ratio/mean"], 1.0)
    close(m["ratio/max_abs_dev"], 0.5)


def test_surrogate_symmetric_clip_clips_1_25():
    # clip 0.2 / 0.2: r 1.25 with A = +2 -> -2 * 1.2 = -2.4, now clipped
    l, m = clipped_surrogate(log_ratio([[1.25, 1.1]]), torch.zeros(1, 2), T([2]), torch.ones(1, 2),
                             clip_low=0.2, clip_high=0.2)
    close(l, [[-2.4, -2.2]])
    close(m["clip_frac"], 0.5)


def test_clip_frac_and_approx_kl_ignore_masked_actions():
    # valid ratios [1.5, 0.5], masked ratio 5.0 (A > 0: would count as clipped high)
    # approx_kl = mean of (r - 1) - log r: (0.5 - 0.4054651) = 0.0945349, (-0.5 + 0.6931472) = 0.1931472
    #   -> 0.1438410
    l, m = clipped_surrogate(log_ratio([[1.5, 0.5, 5.0]]), torch.zeros(1, 3), T([1]), T([[1, 1, 0]]),
                             clip_low=0.2, clip_high=0.2)
    close(l[:, :2], [[-1.2, -0.5]])
    close(m["clip_frac"], 0.5)          # only the 1.5 (high); the 5.0 is masked
    close(m["approx_kl"], 0.1438410)
    close(m["ratio/mean"], 1.0)
    close(m["ratio/max_abs_dev"], 0.5)


def test_dual_clip():
    # c = 3, clip 0.2 / 0.28:
    #   A = -1, r = 10: max(10, 1.28) = 10 -> min(10, 3) = 3 (dual-clipped)
    #   A = -1, r = 2:  max(2, 1.28) = 2 -> min(2, 3) = 2
    #   A = +1, r = 10: max(-10, -1.28) = -1.28 (dual clip only for A < 0)
    #   A = -2, r = 0.5: max(1.0, 1.6) = 1.6 -> min(1.6, 6) = 1.6
    logp = log_ratio([[10.0], [2.0], [10.0], [0.5]])
    l, m = clipped_surrogate(logp, torch.zeros(4, 1), T([-1, -1, 1, -2]), torch.ones(4, 1),
                             clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    close(l, [[3.0], [2.0], [-1.28], [1.6]], atol=1e-4)
    close(m["clip_frac/dual"], 0.25)
    close(m["clip_frac/high"], 0.25)    # the A = +1, r = 10 action
    close(m["clip_frac/low"], 0.25)     # the A = -2, r = 0.5 action
    # without dual clip the first action's loss is 10
    l, _ = clipped_surrogate(logp, torch.zeros(4, 1), T([-1, -1, 1, -2]), torch.ones(4, 1),
                             clip_low=0.2, clip_high=0.28)
    close(l[0], [10.0], atol=1e-4)


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        clipped_surrogate(torch.zeros(1, 1), torch.zeros(1, 1), T([-1]), torch.ones(1, 1),
                          clip_low=0.2, clip_high=0.2, dual_clip=1.0)


def test_gspo_sequence_ratio():
    # mask row 0 [1, 1, 0], row 1 [1, 1, 1]
    # row 0 log r [0.1, 0.3, (5.0 masked)] -> mean 0.2 -> s = exp(0.2) = 1.2214028, A = +1
    # row 1 log r [-0.3, 0, 0]             -> mean -0.1 -> s = exp(-0.1) = 0.9048374, A = -1
    logp = T([[0.1, 0.3, 5.0], [-0.3, 0.0, 0.0]])
    old, mask, adv = torch.zeros(2, 3), T([[1, 1, 0], [1, 1, 1]]), T([1, -1])
    # clip 0.2 / 0.28: both inside -> l = -s A on every action of the sequence
    l, m = clipped_surrogate(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, level="sequence")
    close(l, [[-1.2214028] * 3, [0.9048374] * 3])
    close(m["clip_frac"], 0.0)
    close(m["ratio/mean"], (2 * 1.2214028 + 3 * 0.9048374) / 5)
    # GSPO's range 3e-4 / 4e-4: row 0 -> -(1 + 4e-4) = -1.0004 (high); row 1 -> max(0.9048, 0.9997) = 0.9997 (low)
    l, m = clipped_surrogate(logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4, level="sequence")
    close(l, [[-1.0004] * 3, [0.9997] * 3])
    close(m["clip_frac/high"], 2 / 5)
    close(m["clip_frac/low"], 3 / 5)
    close(m["clip_frac"], 1.0)
    # token level on the same data differs: row 0 action 0 has r = exp(0.1) = 1.1051709
    l, _ = clipped_surrogate(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, level="token")
    close(l[0, 0], -1.1051709)


def test_gspo_gradient_flows_through_the_sequence_mean():
    # s = exp(mean_t log r), inside the clip range; d l_t / d logp_j = -A s / n_valid for valid j
    logp = T([[0.1, 0.3, 5.0]]).requires_grad_()
    l, _ = clipped_surrogate(logp, torch.zeros(1, 3), T([1]), T([[1, 1, 0]]), clip_low=0.2, clip_high=0.28,
                             level="sequence")
    l[0, 0].backward()
    close(logp.grad, [[-1.2214028 / 2, -1.2214028 / 2, 0.0]])


def test_unknown_ratio_level():
    with pytest.raises(ValueError, match="ratio level 'seq' is not one of token, sequence"):
        clipped_surrogate(torch.zeros(1, 1), torch.zeros(1, 1), T([1]), torch.ones(1, 1),
                          clip_low=0.2, clip_high=0.2, level="seq")


@st.composite
def batches(draw):
    n, t = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    old = T(draw(st.lists(st.lists(st.floats(-10, 0, width=32), min_size=t, max_size=t), min_size=n, max_size=n)))
    adv = T(draw(st.lists(st.floats(-5, 5, width=32), min_size=n, max_size=n)))
    mask = T(draw(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=t, max_size=t), min_size=n, max_size=n)))
    mask[0, 0] = 1.0
    return old, adv, mask


@FAST
@given(b=batches(), clip_low=st.floats(1e-4, 0.5), clip_high=st.floats(1e-4, 0.5),
       dual=st.sampled_from([None, 3.0]), level=st.sampled_from(["token", "sequence"]))
def test_on_policy_loss_is_minus_advantage(b, clip_low, clip_high, dual, level):
    old, adv, mask = b
    l, m = clipped_surrogate(old.clone(), old, adv, mask, clip_low=clip_low, clip_high=clip_high,
                             dual_clip=dual, level=level)
    assert torch.equal(l, -adv[:, None].expand_as(l))
    for k in ("clip_frac", "clip_frac/low", "clip_frac/high", "clip_frac/dual", "approx_kl", "ratio/max_abs_dev"):
        assert float(m[k].value) == 0.0, k
    assert float(m["ratio/mean"].value) == 1.0


@FAST
@given(b=batches())
def test_on_policy_gradient_token_mean(b):
    old, adv, mask = b
    logp = old.clone().requires_grad_()
    l, _ = clipped_surrogate(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    aggregate(l, mask, "token-mean").backward()
    expected = -adv[:, None] * mask / mask.sum()
    torch.testing.assert_close(logp.grad, expected, rtol=1e-5, atol=1e-7)
    # the same through policy_loss
    logp2 = old.clone().requires_grad_()
    loss, _ = policy_loss(Scores(log_probs=logp2), old, adv, mask, None, LossSpec(clip_high=0.28))
    loss.backward()
    torch.testing.assert_close(logp2.grad, expected, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- clip fractions at their edges

KEYS = ("clip_frac", "clip_frac/low", "clip_frac/high", "clip_frac/dual")


def _values(metrics) -> dict:
    return {k: float(metrics[k].value) for k in KEYS}


def _assert_fractions(metrics, low: float, high: float) -> None:
    """clip_frac/low and clip_frac/high as given, clip_frac their sum, no dual clipping (fp32 values)."""
    got = _values(metrics)
    want = {"clip_frac": low + high, "clip_frac/low": low, "clip_frac/high": high, "clip_frac/dual": 0.0}
    assert all(abs(got[k] - want[k]) < 1e-7 for k in KEYS), (got, want)


def _surrogate(ratios, adv, mask=None, **kw):
    r = torch.tensor(ratios, dtype=torch.float32)
    mask = torch.ones_like(r) if mask is None else torch.tensor(mask, dtype=torch.float32)
    return clipped_surrogate(torch.log(r), torch.zeros_like(r), torch.tensor(adv, dtype=torch.float32), mask, **kw)


def test_all_zero_advantages_clip_nothing_even_far_outside_the_range():
    """With A = 0 no token is clipped whatever its ratio (clipping only bounds A-weighted gains):
    every clip fraction is exactly 0, the loss is 0, and nothing is NaN."""
    ratios = [[0.1, 0.5, 1.0, 1.5, 10.0], [0.01, 0.79, 1.29, 3.0, 100.0]]
    l, m = _surrogate(ratios, [0.0, 0.0], clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    assert _values(m) == {k: 0.0 for k in KEYS}
    assert float(m["clip_frac"].weight) == 10.0                 # counted over all 10 tokens
    assert torch.equal(l.abs(), torch.zeros(2, 5))
    loss, pm = policy_loss(Scores(log_probs=torch.log(torch.tensor(ratios))), torch.zeros(2, 5), torch.zeros(2),
                           torch.ones(2, 5), None, LossSpec(clip_low=0.2, clip_high=0.28))
    assert float(loss) == 0.0 and float(pm["clip_frac"].value) == 0.0 and float(pm["pg_loss"].value) == 0.0


def test_an_all_masked_microbatch_reports_zero_with_zero_weight():
    """No valid token: the fractions are 0 (not 0/0 = NaN) and carry weight 0, so merged with another
    microbatch they change nothing."""
    _, empty = _surrogate([[5.0, 0.1]], [1.0], mask=[[0, 0]], clip_low=0.2, clip_high=0.2)
    assert _values(empty) == {k: 0.0 for k in KEYS}
    assert float(empty["clip_frac"].weight) == 0.0
    _, full = _surrogate([[5.0, 1.0]], [1.0], clip_low=0.2, clip_high=0.2)      # 1 of 2 clipped (high)
    merged = Accumulator().add(empty).add(full).result()
    assert merged["clip_frac"] == 0.5 and merged["clip_frac/high"] == 0.5 and merged["clip_frac/low"] == 0.0
    assert not any(math.isnan(v) for v in merged.values())


# clip-higher: eps_low = 0.1, eps_high = 0.3, ratios clipped into [0.9, 1.3]
#   A > 0: only r > 1.3 clips (high); r < 0.9 does not (a smaller gain is not bounded)
#   A < 0: only r < 0.9 clips (low); r > 1.3 does not
#   A = 0: never
# Ratios between 1 + eps_low = 1.1 and 1 + eps_high = 1.3, or between 1 - eps_high = 0.7 and
# 1 - eps_low = 0.9, tell eps_low and eps_high apart.
CLIP_HIGHER_TABLE = [
    # ratio, advantage, side
    (1.2, +1.0, None),     # above 1 + eps_low, below 1 + eps_high
    (1.35, +1.0, "high"),
    (2.0, +0.5, "high"),
    (0.8, +1.0, None),     # A > 0 is not clipped below
    (0.5, +2.0, None),
    (0.85, -1.0, "low"),   # below 1 - eps_low, above 1 - eps_high
    (0.6, -1.0, "low"),
    (0.95, -1.0, None),
    (1.2, -1.0, None),     # A < 0 is not clipped above
    (1.5, -2.0, None),
    (1.5, 0.0, None),      # A = 0: never
    (0.5, 0.0, None),
]


def test_clip_higher_table_counts_each_side():
    """One token per row (a sequence of length 1 each): the low / high / total fractions and the
    per-token losses match the hand table above."""
    ratios = [[r] for r, _, _ in CLIP_HIGHER_TABLE]
    adv = [a for _, a, _ in CLIP_HIGHER_TABLE]
    l, m = _surrogate(ratios, adv, clip_low=0.1, clip_high=0.3)
    n = len(CLIP_HIGHER_TABLE)
    high = sum(side == "high" for _, _, side in CLIP_HIGHER_TABLE)
    low = sum(side == "low" for _, _, side in CLIP_HIGHER_TABLE)
    assert (high, low) == (2, 2)
    _assert_fractions(m, low=low / n, high=high / n)          # 2/12 each, 4/12 in all
    # l = max(-r A, -clip(r, 0.9, 1.3) A)
    want = [max(-r * a, -min(max(r, 0.9), 1.3) * a) for r, a, _ in CLIP_HIGHER_TABLE]
    torch.testing.assert_close(l[:, 0], torch.tensor(want), rtol=0, atol=1e-6)


def test_clip_higher_sides_with_a_mask_and_the_eps_swapped():
    """The same tokens with eps_low and eps_high swapped (0.3 / 0.1: range [0.7, 1.1]) clip differently:
    r 1.2 with A > 0 now clips high, r 0.85 with A < 0 no longer clips low. A masked clipped token
    counts nowhere."""
    ratios = [[1.2, 1.35, 0.85, 0.6, 1.5]]
    _assert_fractions(_surrogate(ratios, [1.0], clip_low=0.1, clip_high=0.3)[1], low=0, high=2 / 5)
    _assert_fractions(_surrogate(ratios, [1.0], clip_low=0.3, clip_high=0.1)[1], low=0, high=3 / 5)
    _assert_fractions(_surrogate(ratios, [-1.0], clip_low=0.1, clip_high=0.3)[1], low=2 / 5, high=0)
    _assert_fractions(_surrogate(ratios, [-1.0], clip_low=0.3, clip_high=0.1)[1], low=1 / 5, high=0)
    masked = _surrogate(ratios, [-1.0], mask=[[1, 1, 0, 1, 1]], clip_low=0.1, clip_high=0.3)[1]   # 0.85 masked
    _assert_fractions(masked, low=1 / 4, high=0)


# ---------------------------------------------------------------- aggregation
# l = [[1, 2, 100], [4, 5, 6]], mask [[1, 1, 0], [1, 1, 1]] (the 100 is padding)
L = T([[1, 2, 100], [4, 5, 6]])
M = T([[1, 1, 0], [1, 1, 1]])
AGG_TABLE = {
    "token-mean": 3.6,                # (1 + 2 + 4 + 5 + 6) / 5 = 18 / 5
    "seq-mean-token-mean": 3.25,      # (3 / 2 + 15 / 3) / 2 = (1.5 + 5) / 2
    "seq-mean-token-sum": 9.0,        # (3 + 15) / 2
    "seq-mean-token-sum-norm": 3.0,   # (3 / 3 + 15 / 3) / 2 with max_len = T = 3
}


@pytest.mark.parametrize("mode", sorted(AGG_TABLE))
def test_aggregation_table(mode):
    close(aggregate(L, M, mode), AGG_TABLE[mode])


def test_aggregation_registry_is_covered():
    assert set(AGGREGATIONS) == set(AGG_TABLE)
    with pytest.raises(KeyError, match="'algo.aggregation': unknown loss aggregation 'sum'.*token-mean"):
        aggregate(L, M, "sum")


def test_seq_mean_token_sum_norm_constant():
    # max_len 6: (3 / 6 + 15 / 6) / 2 = 1.5
    close(aggregate(L, M, "seq-mean-token-sum-norm", Normalizer.of(M, max_len=6)), 1.5)
    n = Normalizer.of(M)
    assert (n.num_seqs, n.num_tokens, n.max_len, n.world_size) == (2, 5.0, 3, 1)


def test_world_size_division():
    # totals are global; each process's loss is multiplied by world_size so DDP's mean is right
    norm = Normalizer(num_seqs=2, num_tokens=5, max_len=3, world_size=2)
    expected = {"token-mean": 7.2, "seq-mean-token-mean": 6.5, "seq-mean-token-sum": 18.0,
                "seq-mean-token-sum-norm": 6.0}
    for mode, value in expected.items():
        close(aggregate(L, M, mode, norm), value)


_gen = torch.Generator().manual_seed(0)
BIG_L = torch.randn(6, 5, generator=_gen)
BIG_M = T([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])


@pytest.mark.parametrize("mode", sorted(AGG_TABLE))
@pytest.mark.parametrize("split", [1, 2, 3, 5])
def test_microbatch_losses_sum_to_full_batch_loss(mode, split):
    full = aggregate(BIG_L, BIG_M, mode)
    norm = Normalizer.of(BIG_M)
    parts = aggregate(BIG_L[:split], BIG_M[:split], mode, norm) + aggregate(BIG_L[split:], BIG_M[split:], mode, norm)
    close(parts, full)


@pytest.mark.parametrize("mode", sorted(AGG_TABLE))
def test_processes_average_to_full_batch_loss(mode):
    # two processes, each with two microbatches; DDP averages the two processes' gradients
    full = aggregate(BIG_L, BIG_M, mode)
    g = Normalizer.of(BIG_M)
    norm = Normalizer(g.num_seqs, g.num_tokens, g.max_len, world_size=2)
    rank = [sum(aggregate(BIG_L[s], BIG_M[s], mode, norm) for s in (slice(a, a + 1), slice(a + 1, a + 3)))
            for a in (0, 3)]
    close((rank[0] + rank[1]) / 2, full)


# ---------------------------------------------------------------- KL estimators

def test_kl_estimators_by_hand():
    # d = ref - logp = [0, 1, -1]
    logp, ref = T([-1, -1, -2]), T([-1, 0, -3])
    close(kl_k1(logp, ref), [0, -1, 1])                          # -d
    close(kl_k2(logp, ref), [0, 0.5, 0.5])                        # d^2 / 2
    close(kl_k3(logp, ref), [0, math.e - 2, math.exp(-1)])        # e^d - d - 1: [0, 0.7182818, 0.3678794]
    close(kl_estimate(logp, ref, "k3"), [0, 0.7182818, 0.3678794])
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}
    with pytest.raises(KeyError, match="'algo.kl_estimator': unknown KL estimator 'k4'.*k1, k2, k3"):
        kl_estimate(logp, ref, "k4")


NEAR_ZERO = st.floats(-1e-3, 1e-3).map(lambda x: float(torch.tensor(x, dtype=torch.float32)))  # where k3 cancels


@FAST
@given(logp=st.floats(-20, 20, width=32), ref=st.one_of(st.floats(-20, 20, width=32), NEAR_ZERO))
@example(logp=0.0, ref=3.1e-8)   # exp(3.1e-8) rounds to 1 in fp32, and 1 - 3.1e-8 rounds down
def test_k3_is_nonnegative(logp, ref):
    assert float(kl_estimate(T([logp]), T([ref]), "k3")[0]) >= 0.0


# ---------------------------------------------------------------- policy_loss
# one sample, T = 2, on-policy (ratio 1), A = 0.5 -> surrogate -0.5 per action
OLD = T([[-1.0, -1.0]])
ADV = T([0.5])
MASK = T([[1, 1]])
REF = T([[-1.0, 0.0]])       # d = [0, 1] -> k3 = [0, e - 2 = 0.7182818]


def test_policy_loss_adds_beta_kl():
    spec = LossSpec(kl_beta=0.1, kl_estimator="k3")
    loss, m = policy_loss(Scores(log_probs=OLD.clone()), OLD, ADV, MASK, REF, spec)
    # mean(-0.5, -0.5 + 0.1 * 0.7182818) = -0.4640859
    close(loss, -0.4640859)
    close(m["kl"], 0.3591409)
    close(m["pg_loss"], -0.5)
    # k1: d = [0, 1] -> k1 = [0, -1]: mean(-0.5, -0.6) = -0.55
    loss, _ = policy_loss(Scores(log_probs=OLD.clone()), OLD, ADV, MASK, REF, LossSpec(kl_beta=0.1, kl_estimator="k1"))
    close(loss, -0.55)


def test_policy_loss_beta_zero_ignores_reference():
    loss, m = policy_loss(Scores(log_probs=OLD.clone()), OLD, ADV, MASK, None, LossSpec())
    close(loss, -0.5)
    assert "kl" not in m


def test_policy_loss_beta_without_reference_is_an_error():
    with pytest.raises(ValueError, match="kl_beta > 0 but the policy gave no reference log-probs"):
        policy_loss(Scores(log_probs=OLD.clone()), OLD, ADV, MASK, None, LossSpec(kl_beta=0.1))


def test_scores_kl_overrides_the_estimator():
    scores = Scores(log_probs=OLD.clone(), kl=T([[1.0, 1.0]]))
    for ref in (None, REF):
        loss, m = policy_loss(scores, OLD, ADV, MASK, ref, LossSpec(kl_beta=0.1))
        close(loss, -0.4)            # mean(-0.5 + 0.1, -0.5 + 0.1)
        close(m["kl"], 1.0)


def test_entropy_bonus():
    scores = Scores(log_probs=OLD.clone(), entropy=T([[2.0, 4.0]]))
    loss, m = policy_loss(scores, OLD, ADV, MASK, None, LossSpec(entropy_coef=0.01))
    close(loss, -0.53)               # mean(-0.5 - 0.02, -0.5 - 0.04)
    close(m["entropy"], 3.0)
    loss, m = policy_loss(scores, OLD, ADV, MASK, None, LossSpec())
    close(loss, -0.5)                # coef 0: entropy only reported
    close(m["entropy"], 3.0)
    with pytest.raises(ValueError, match="entropy_coef != 0 but this policy does not compute entropies"):
        policy_loss(Scores(log_probs=OLD.clone()), OLD, ADV, MASK, None, LossSpec(entropy_coef=0.01))


def test_policy_loss_uses_the_given_normalizer():
    # 2 valid actions in this microbatch, 8 in the step -> loss -0.5 * 2 / 8 = -0.125
    loss, _ = policy_loss(Scores(log_probs=OLD.clone()), OLD, ADV, MASK, None, LossSpec(),
                          Normalizer(num_seqs=4, num_tokens=8, max_len=2))
    close(loss, -0.125)


def test_loss_spec_takes_every_algo_key_from_the_config(bandit_config):
    """The update's LossSpec carries each `algo.*` loss key as loaded (none dropped back to its default)."""
    cfg = load_config(bandit_config, ["algo.clip_low=0.1", "algo.clip_high=0.3", "algo.policy_loss=dual_clip",
                               "algo.dual_clip=2.5", "algo.aggregation=seq-mean-token-sum",
                               "algo.kl_beta=0.05", "algo.kl_estimator=k2", "algo.entropy_coef=0.01"])
    assert loss_spec(cfg.algo) == LossSpec(policy_loss="dual_clip", clip_low=0.1, clip_high=0.3, dual_clip=2.5,
                                           aggregation="seq-mean-token-sum", kl_beta=0.05, kl_estimator="k2",
                                           entropy_coef=0.01)


def test_policy_loss_runs_the_named_loss_and_masks_its_metrics():
    """policy_loss runs the named entry: dual_clip with its constant (3 when unset), gspo at the sequence level
    (its loss equals the clipped surrogate's
    aggregated by hand); kl and entropy metrics are means over the mask only (masked positions may hold
    anything); pg_loss is weighted by tokens for token-mean and by sequences otherwise."""
    logp = torch.tensor([[0.0, 1.5, 0.3], [0.2, -0.4, 9.0]])            # [2, 3]
    old = torch.zeros(2, 3)
    adv = torch.tensor([-1.0, 0.5])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ref = torch.tensor([[0.1, 0.2, 0.3], [0.0, 0.0, 50.0]])
    ent = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    cases = [(LossSpec(policy_loss="dual_clip", dual_clip=2.0), dict(dual_clip=2.0)),
             (LossSpec(policy_loss="dual_clip"), dict(dual_clip=3.0)),
             (LossSpec(policy_loss="gspo"), dict(level="sequence")),
             (LossSpec(policy_loss="gspo", aggregation="seq-mean-token-mean"), dict(level="sequence"))]
    for spec, how in cases:
        loss, metrics = policy_loss(Scores(logp, entropy=ent), old, adv, mask, None, spec)
        l, _ = clipped_surrogate(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, **how)
        torch.testing.assert_close(loss, aggregate(l, mask, spec.aggregation))
        assert float(metrics["pg_loss"].weight) == (5.0 if spec.aggregation == "token-mean" else 2.0)
        assert float(metrics["entropy"].value) == 3.0                  # (1+2+3+4+5) / 5
    plain, _ = policy_loss(Scores(logp), old, adv, mask, None, LossSpec())
    dual = policy_loss(Scores(logp), old, adv, mask, None, LossSpec(policy_loss="dual_clip"))[0]
    assert abs(float(plain) - float(dual)) > 1e-3
    _, metrics = policy_loss(Scores(logp), old, adv, mask, ref, LossSpec(kl_beta=0.1, kl_estimator="k1"))
    expected_kl = float(((logp - ref) * mask).sum() / 5)
    assert float(metrics["kl"].value) == pytest.approx(expected_kl) and float(metrics["kl"].weight) == 5.0
