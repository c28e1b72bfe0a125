"""MixGRPO's sliding window (policy.timesteps.select=window) by hand tables: at training step t the
window starts at min((t // window_every) * window_stride, S - window_size), its steps are the SDE
(and trained) steps, every other step is an ODE step. The tables use window_every 1 and 3 with a
stride that differs from it, so that `every` and `stride` cannot be confused, and run past the clamp."""

import pytest
import torch

from diffusion.timesteps import TimestepsConfig, plan, trained_index, window_start


def _sde_steps(cfg: TimestepsConfig, s: int, step: int, n: int = 2) -> list[int]:
    """The SDE steps of the plan at training step `step`, checked to be exactly the trained steps of
    each of the n samples."""
    p = plan(cfg, s, n, step, torch.Generator().manual_seed(0))
    sde = torch.nonzero(p.sde).squeeze(1).tolist()
    assert torch.equal(p.trained, p.sde.expand(n, s)), (step, p.trained)
    index, mask = trained_index(p.trained)
    assert index.tolist() == [sde] * n and bool((mask == 1).all())
    return sde


# S = 8, window_size = 3, window_stride = 2, window_every = 3: moves at training steps 3, 6, 9, ...;
# start 0, 2, 4, then 6 would pass S - window_size = 5 and is clamped to 5
EVERY_3 = {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2],
           3: [2, 3, 4], 4: [2, 3, 4], 5: [2, 3, 4],
           6: [4, 5, 6], 7: [4, 5, 6], 8: [4, 5, 6],
           9: [5, 6, 7], 10: [5, 6, 7], 11: [5, 6, 7], 12: [5, 6, 7], 50: [5, 6, 7]}

# S = 6, window_size = 2, window_stride = 1, window_every = 1: one step further per training step
# until the start reaches S - window_size = 4
EVERY_1 = {0: [0, 1], 1: [1, 2], 2: [2, 3], 3: [3, 4], 4: [4, 5], 5: [4, 5], 6: [4, 5], 100: [4, 5]}

# S = 10, window_size = 4, window_stride = 3, window_every = 1: starts 0, 3, 6 (= S - window_size) ...
STRIDE_3 = {0: [0, 1, 2, 3], 1: [3, 4, 5, 6], 2: [6, 7, 8, 9], 3: [6, 7, 8, 9]}


@pytest.mark.parametrize("cfg,s,table", [
    (TimestepsConfig(select="window", window_size=3, window_stride=2, window_every=3), 8, EVERY_3),
    (TimestepsConfig(select="window", window_size=2, window_stride=1, window_every=1), 6, EVERY_1),
    (TimestepsConfig(select="window", window_size=4, window_stride=3, window_every=1), 10, STRIDE_3),
], ids=["every3-stride2", "every1-stride1", "every1-stride3"])
def test_window_sde_steps_by_training_step(cfg, s, table):
    """The SDE steps at each training step equal the hand table, the clamp at S - window_size included."""
    got = {step: _sde_steps(cfg, s, step) for step in table}
    assert got == table
    assert {step: window_start(cfg, s, step) for step in table} == {step: w[0] for step, w in table.items()}


def test_window_stride_zero_never_moves_and_eval_uses_the_first_window():
    """Stride 0 keeps the window at the start; evaluation (step -1) takes the window at 0."""
    still = TimestepsConfig(select="window", window_size=2, window_stride=0, window_every=1)
    assert [_sde_steps(still, 5, t) for t in (0, 1, 7)] == [[0, 1]] * 3
    moving = TimestepsConfig(select="window", window_size=2, window_stride=2, window_every=3)
    assert window_start(moving, 8, -1) == 0 and _sde_steps(moving, 8, -1) == [0, 1]


def test_a_window_as_wide_as_the_rollout_covers_every_step():
    """window_size = S: S - window_size = 0 clamps every start to 0, so all S steps are SDE steps."""
    cfg = TimestepsConfig(select="window", window_size=5, window_stride=2, window_every=1)
    assert [_sde_steps(cfg, 5, t) for t in (0, 1, 4)] == [[0, 1, 2, 3, 4]] * 3
