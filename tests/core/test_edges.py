"""Clip-fraction metrics of the clipped surrogate at their edges: all-zero advantages (nothing can be
clipped, and the fractions are 0, not NaN), an all-masked microbatch, and clip-higher
(eps_low != eps_high) tables where each token is clipped on a known side or not at all; and the
LossSpec the update builds from the `algo:` config keys."""

import math

import pytest
import torch

from mmrl.algorithms.losses import LossSpec, clipped_surrogate, policy_loss
from mmrl.distributed.reduce import Accumulator
from mmrl.types import Scores

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
TABLE = [
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
    ratios = [[r] for r, _, _ in TABLE]
    adv = [a for _, a, _ in TABLE]
    l, m = _surrogate(ratios, adv, clip_low=0.1, clip_high=0.3)
    n = len(TABLE)
    high = sum(side == "high" for _, _, side in TABLE)
    low = sum(side == "low" for _, _, side in TABLE)
    assert (high, low) == (2, 2)
    _assert_fractions(m, low=low / n, high=high / n)          # 2/12 each, 4/12 in all
    # l = max(-r A, -clip(r, 0.9, 1.3) A)
    want = [max(-r * a, -min(max(r, 0.9), 1.3) * a) for r, a, _ in TABLE]
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


def test_loss_spec_takes_every_algo_key_from_the_config():
    """The update's LossSpec carries each `algo.*` loss key as loaded (none dropped back to its default)."""
    from mmrl.config import load_config
    from mmrl.algorithms.losses import LossSpec
    from mmrl.algorithms.objectives.pg import loss_spec
    from testkit import BANDIT

    cfg = load_config(BANDIT, ["algo.clip_low=0.1", "algo.clip_high=0.3", "algo.policy_loss=dual_clip",
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
    from mmrl.algorithms.losses import aggregate

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
