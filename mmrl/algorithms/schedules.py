"""Learning-rate schedules (`optim.schedule`), one registered entry each: `fn(frac) -> multiplier` of optim.lr,
with frac in [0, 1] the fraction of the run's optimizer steps done after the linear warm-up
(`optim.warmup_steps`, which `lr_lambda` applies to every schedule)."""

from __future__ import annotations

import math
from typing import Callable

from mmrl.registry import Registry

SCHEDULES: Registry = Registry("learning-rate schedule")


@SCHEDULES.register("constant")
def constant(frac: float) -> float:
    """The learning rate stays at optim.lr (after the warm-up)."""
    return 1.0


@SCHEDULES.register("linear")
def linear(frac: float) -> float:
    """Linear decay to 0 at the last optimizer step."""
    return 1.0 - frac


@SCHEDULES.register("cosine")
def cosine(frac: float) -> float:
    """Half a cosine from 1 to 0 (Loshchilov and Hutter, arXiv 1608.03983, without restarts)."""
    return 0.5 * (1 + math.cos(math.pi * frac))


def lr_lambda(schedule: str, warmup_steps: int, total: int) -> Callable[[int], float]:
    """Optimizer step i -> the multiplier of optim.lr: (i + 1) / warmup during the warm-up, then the schedule
    over the remaining steps (for `torch.optim.lr_scheduler.LambdaLR`)."""
    fn = SCHEDULES.resolve(schedule, "optim.schedule")

    def f(i: int) -> float:
        if warmup_steps and i < warmup_steps:
            return (i + 1) / warmup_steps
        return fn(min(1.0, (i - warmup_steps) / max(1, total - warmup_steps)))

    return f
