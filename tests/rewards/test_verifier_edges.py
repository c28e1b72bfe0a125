"""Edges of the `numeric` verifier (signs, division by zero, malformed fractions, non-finite numbers)
and of the scorer's failure threshold `max_fail_frac` (a batch of one, counts exactly at the bound).

`numeric` documents: 1.0 if the answer's last number is within tolerance of the gold, else 0.0; None
(unscorable) if the output is not a str or the gold has no usable number. A prediction without a
usable number scores 0.0. It never raises on a malformed number."""

import math

import pytest

from rewards.builtin.text import numeric, parse_number
from rewards.sample import Sample
from rewards.scorer import RewardError, RewardSet, parse_specs


def score(output, answer):
    return numeric([Sample(prompt="q", output=output, answer=answer)])[0]


@pytest.mark.parametrize("output, answer, expected", [
    ("-3", "-3", 1.0),
    ("<answer>-3</answer>", -3, 1.0),
    ("-3", "3", 0.0),                     # the sign counts, both ways
    ("3", "-3", 0.0),
    ("<answer>x = -3</answer>", "3", 0.0),
    ("+3", "3", 1.0),
    ("-0", "0", 1.0),                     # -0.0 == 0.0
    ("-3/4", "-0.75", 1.0),
    ("-2.5e-3", "-0.0025", 1.0),
    ("-1,000", "-1000", 1.0),
    ("-1,000", "1000", 0.0),
])
def test_negative_numbers(output, answer, expected):
    """A leading minus is part of the number: -3 matches -3 and never 3."""
    assert score(output, answer) == expected


@pytest.mark.parametrize("output, answer, expected", [
    ("1/0", "0", 0.0),                    # a prediction dividing by zero has no number: 0.0
    ("1/0", "1", 0.0),
    ("0/0", "0", 0.0),
    ("-1/0", "-1", 0.0),
    ("<answer>1 / 0</answer>", "0", 0.0),
    ("1/0.0", "0", 0.0),                  # a decimal zero denominator too (not the number ".0")
    ("1/0.0", "1", 0.0),
    ("3/1.5", "2", 1.0),                  # a decimal denominator divides
    ("3/1.5", "0.5", 0.0),
    ("1/", "1", 1.0),                     # malformed: the number before the slash
    ("/4", "4", 1.0),
    ("1/0", "1/0", None),                 # a gold dividing by zero is unusable: unscorable
    ("0", "1/0", None),
    ("2", "4/0.0", None),
    ("1/0", "n/a", None),
])
def test_division_by_zero_and_malformed_fractions(output, answer, expected):
    """Division by zero never raises: in the prediction it scores 0.0, in the gold it makes the sample
    unscorable (None); a decimal denominator is read as one."""
    assert score(output, answer) == expected


@pytest.mark.parametrize("output, answer, expected", [
    ("1e999", "5", 0.0),                  # overflows to inf: no usable number
    ("-1e999", "-1e999", None),           # an infinite gold is unusable ...
    ("1", "1e999", None),                 # ... rather than matching every prediction (|1 - inf| <= inf)
    ("1", float("inf"), None),
    ("1", float("-inf"), None),
    ("1", float("nan"), None),
    ("nan", "1", 0.0),
])
def test_non_finite_numbers_are_unusable(output, answer, expected):
    """inf / nan never match anything: an infinite prediction scores 0.0, an infinite or NaN gold is
    unscorable, and no finite prediction is ever found within tolerance of an infinite gold."""
    assert score(output, answer) == expected


def test_parse_number_never_raises_on_malformed_text():
    """parse_number returns a finite float or None for any text."""
    for text in ("1/0", "0/0", "1/0.0", "1//2", "1/-0", "--3", "1e", "1e999", "1e-999", ".", "-", "/", ",", "1,",
                 "9" * 400, "1/" + "0" * 400, "nan", "inf", "", "  "):
        value = parse_number(text)
        assert value is None or math.isfinite(value), (text, value)
    assert parse_number("1e-999") == 0.0 and parse_number("1//2") == 2.0 and parse_number("--3") == -3.0


# ---------------------------------------------------------------- the failure threshold of a batch

def fails_on_x(batch):
    """Scores 1.0, except that an output "x" raises (isolated to that sample)."""
    if any(s.output == "x" for s in batch):
        raise ValueError("cannot score x")
    return [1.0] * len(batch)


def none_on_x(batch):
    """Scores 1.0, except None (unscorable, without raising) for an output "x"."""
    return [None if s.output == "x" else 1.0 for s in batch]


def _batch(outputs):
    return [Sample(prompt="q", output=o, id=f"sample {i}") for i, o in enumerate(outputs)]


def _rewards(fn, frac=None):
    entry = {"name": f"{__file__}:{fn}", "label": "r"}
    if frac is not None:
        entry["max_fail_frac"] = frac
    return RewardSet(parse_specs([entry]))


@pytest.mark.parametrize("fn", ["fails_on_x", "none_on_x"])
def test_one_failure_in_a_batch_of_one_stops_under_the_default_threshold(fn):
    """1 failed of 1 is a fraction of 1.0 > max_fail_frac (0.5 by default, 0.0, 0.99): RewardError."""
    for frac in (None, 0.0, 0.99):
        with pytest.raises(RewardError, match=r"'r' failed on 1 of 1 samples"):
            _rewards(fn, frac).score(_batch(["x"]))


@pytest.mark.parametrize("fn", ["fails_on_x", "none_on_x"])
def test_one_failure_in_a_batch_of_one_is_allowed_at_max_fail_frac_one(fn):
    """max_fail_frac = 1.0: a fraction of exactly 1.0 is not more than it; the sample is NaN and counted."""
    scores, metrics = _rewards(fn, 1.0).score(_batch(["x"]))
    assert scores.shape == (1, 1) and math.isnan(float(scores[0, 0]))
    assert metrics["reward/r/failed"] == 1 and math.isnan(metrics["reward/r/mean"])


def test_a_batch_of_one_that_succeeds_passes_even_at_max_fail_frac_zero():
    """0 failed of 1 is not more than 0.0."""
    scores, metrics = _rewards("fails_on_x", 0.0).score(_batch(["ok"]))
    assert scores.tolist() == [[1.0]] and metrics["reward/r/failed"] == 0


@pytest.mark.parametrize("fn", ["fails_on_x", "none_on_x"])
@pytest.mark.parametrize("frac, n, failed, stops", [
    (0.5, 4, 2, False),       # exactly at the threshold: allowed
    (0.5, 4, 3, True),        # one more: stops
    (0.25, 4, 1, False),
    (0.25, 4, 2, True),
    (0.1, 10, 1, False),
    (0.1, 10, 2, True),
    (0.3, 10, 3, False),      # 3 / 10 == 0.3 in floating point too
    (0.3, 10, 4, True),
    (0.0, 4, 0, False),
    (0.0, 4, 1, True),
])
def test_the_threshold_is_exclusive(fn, frac, n, failed, stops):
    """A batch stops only when failed / n is strictly more than max_fail_frac."""
    rs = _rewards(fn, frac)
    batch = _batch(["x"] * failed + ["ok"] * (n - failed))
    if stops:
        with pytest.raises(RewardError, match=rf"failed on {failed} of {n} samples"):
            rs.score(batch)
    else:
        scores, metrics = rs.score(batch)
        assert metrics["reward/r/failed"] == failed and scores.shape == (n, 1)
        assert sum(math.isnan(v) for v in scores[:, 0].tolist()) == failed


def test_an_empty_batch_is_no_failure():
    """No samples: nothing failed (no 0 / 0), an empty [0, 1] score matrix."""
    scores, metrics = _rewards("none_on_x", 0.0).score([])
    assert scores.shape == (0, 1) and metrics["reward/r/failed"] == 0
