"""Which denoising steps are stochastic (SDE) and which are trained, per sample.

A rollout runs S denoising steps. The plan says, per step, whether it samples from the SDE (the
others take the deterministic ODE / DDIM step) and, per sample, which steps are trained (the
actions of the policy, T of them). Policies (`policy.timesteps.select`):

    all       every step is SDE and trained (DDPO, arXiv 2305.13301)
    fraction  every step is SDE; each sample trains a random subset of round(fraction * S) steps
              (DanceGRPO, arXiv 2505.07818, 60%)
    first_k   every step is SDE; the first k steps are trained (Flow-GRPO, arXiv 2505.05470: 9 of 10)
    window    SDE and training only inside a window of `window_size` steps whose start advances by
              `window_stride` every `window_every` training steps, clamped at S - window_size; ODE
              elsewhere (MixGRPO, arXiv 2507.21802)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SELECTS = ("all", "fraction", "first_k", "window")


@dataclass(frozen=True)
class TimestepsConfig:
    select: str = "all"          # all | fraction | first_k | window
    fraction: float = 0.6        # fraction: share of the S steps each sample trains
    k: int = 1                   # first_k: number of leading steps trained
    window_size: int = 4         # window: steps inside the window
    window_stride: int = 1       # window: steps the window advances per move
    window_every: int = 1        # window: training steps between moves


@dataclass(frozen=True)
class StepPlan:
    sde: torch.Tensor      # [S] bool, True where the step samples from the SDE
    trained: torch.Tensor  # [n, S] bool, True where sample i trains step s (always an SDE step)


def validate(cfg: TimestepsConfig, num_steps: int) -> None:
    """Raise ValueError naming the `policy.timesteps.*` key that cannot work with S = num_steps."""
    if cfg.select not in SELECTS:
        raise ValueError(f"config key 'policy.timesteps.select' must be one of {', '.join(SELECTS)}; "
                         f"got {cfg.select!r}")
    if cfg.select == "fraction" and not 0 < cfg.fraction <= 1:
        raise ValueError(f"config key 'policy.timesteps.fraction' must be in (0, 1], got {cfg.fraction}")
    if cfg.select == "first_k" and not 1 <= cfg.k <= num_steps:
        raise ValueError(f"config key 'policy.timesteps.k' must be in [1, rollout_steps={num_steps}], got {cfg.k}")
    if cfg.select == "window":
        if not 1 <= cfg.window_size <= num_steps:
            raise ValueError(f"config key 'policy.timesteps.window_size' must be in [1, rollout_steps={num_steps}], "
                             f"got {cfg.window_size}")
        if cfg.window_stride < 0 or cfg.window_every < 1:
            raise ValueError("config keys 'policy.timesteps.window_stride' (>= 0) and 'policy.timesteps.window_every' "
                             f"(>= 1) got {cfg.window_stride} and {cfg.window_every}")


def window_start(cfg: TimestepsConfig, num_steps: int, step: int) -> int:
    """First step of the MixGRPO window at training step `step` (eval: step < 0 -> 0)."""
    moves = max(step, 0) // cfg.window_every
    return min(moves * cfg.window_stride, num_steps - cfg.window_size)


def plan(cfg: TimestepsConfig, num_steps: int, n: int, step: int, generator: torch.Generator) -> StepPlan:
    """The step plan of n samples at training step `step`; `generator` (CPU) draws the `fraction` subsets."""
    s = num_steps
    sde = torch.ones(s, dtype=torch.bool)                                     # [S]
    trained = torch.zeros(n, s, dtype=torch.bool)                             # [n, S]
    if cfg.select == "all":
        trained[:] = True
    elif cfg.select == "fraction":
        t = max(1, round(cfg.fraction * s))
        for i in range(n):
            trained[i, torch.randperm(s, generator=generator)[:t]] = True
    elif cfg.select == "first_k":
        trained[:, :cfg.k] = True
    elif cfg.select == "window":
        lo = window_start(cfg, s, step)
        sde[:] = False
        sde[lo:lo + cfg.window_size] = True
        trained[:, lo:lo + cfg.window_size] = True
    else:
        raise ValueError(f"config key 'policy.timesteps.select' must be one of {', '.join(SELECTS)}; "
                         f"got {cfg.select!r}")
    return StepPlan(sde=sde, trained=trained)


def trained_index(trained: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, S] bool -> (step index [n, T] long, mask [n, T] float), T = most trained steps of any sample.

    Each row lists its trained steps in increasing order, right-padded with step 0 and mask 0.
    """
    n, s = trained.shape
    counts = trained.sum(1)                                                   # [n]
    t = int(counts.max()) if trained.numel() else 0
    step = torch.arange(s)                                                    # [S]
    first = torch.where(trained, step, s + step).argsort(dim=1)[:, :t]        # [n, T] trained steps first, in order
    mask = (torch.arange(t) < counts[:, None]).float()                        # [n, T]
    return torch.where(mask > 0, first, 0), mask
