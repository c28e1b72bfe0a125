"""Learning-rate schedules (`mmrl.algorithms.schedules`): the multiplier of optim.lr per optimizer step, by hand."""

import math

import pytest

from mmrl.algorithms.schedules import SCHEDULES, lr_lambda


@pytest.mark.parametrize("schedule,expected", [
    # warm-up 2 of 6 steps: (i + 1) / 2 for i < 2, then frac = (i - 2) / 4 over the remaining 4
    ("constant", [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]),
    ("cosine", [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]),
])
def test_warmup_then_the_schedule_table(schedule, expected):
    f = lr_lambda(schedule, warmup_steps=2, total=6)
    assert [f(i) for i in range(7)] == pytest.approx(expected, abs=1e-12)


def test_the_registry_names_the_key_and_the_schedules():
    assert SCHEDULES.names() == ["constant", "cosine", "linear"]
    with pytest.raises(ValueError, match="optim.schedule.*unknown learning-rate schedule 'exp'; valid names: "
                                         "constant, cosine, linear"):
        lr_lambda("exp", 0, 10)
