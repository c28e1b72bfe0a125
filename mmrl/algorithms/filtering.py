"""Group filters: which prompt groups of a step carry a learning signal.

Each takes the combined rewards r [P, G] (NaN = unscorable) and returns keep [P] (bool). A filter registered
with `resamples=True` has the generator sample further rounds of prompts until the step is full
(`algo.filter.max_resample_rounds`); the others train on the groups they keep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mmrl.algorithms.advantages import group_stats
from mmrl.errors import ConfigError
from mmrl.registry import Registry

FILTERS: Registry = Registry("group filter")
RESAMPLING: set[str] = set()          # filters whose dropped groups are replaced by new prompts' groups


def register(name: str, *, resamples: bool = False):
    """Decorator: `@register("name", resamples=...)` on a `fn(r [P, G], keep_frac) -> keep [P]`."""

    def deco(fn):
        FILTERS.register(name)(fn)
        if resamples:
            RESAMPLING.add(name)
        return fn

    return deco


@dataclass(frozen=True)
class FilterConfig:
    """The `algo.filter` section."""

    name: str = "none"                    # none | dynamic (DAPO) | starpo (keep the highest-spread groups)
    keep_frac: float = 0.5                # starpo: fraction of groups kept
    max_resample_rounds: int = 3          # a resampling filter (dynamic): extra rollout rounds to fill the step


def check(section: FilterConfig) -> None:
    """Load-time checks of `algo.filter` (ConfigError naming the key)."""
    try:
        FILTERS.check(section.name, "algo.filter.name")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not 0 < section.keep_frac <= 1:
        raise ConfigError(f"config key 'algo.filter.keep_frac' must be in (0, 1], got {section.keep_frac}")
    if section.max_resample_rounds < 0:
        raise ConfigError(f"config key 'algo.filter.max_resample_rounds' must be >= 0, "
                          f"got {section.max_resample_rounds}")


def group_spread(r: torch.Tensor) -> torch.Tensor:
    """Unbiased std of each group's valid rewards, 0 with fewer than two. [P, G] -> [P]"""
    return group_stats(r).std[:, 0]                                  # [P]


@register("none")
def keep_all(r: torch.Tensor, keep_frac: float = 1.0) -> torch.Tensor:
    """Keep every group."""
    return torch.ones(r.shape[0], dtype=torch.bool)


@register("dynamic", resamples=True)
def has_signal(r: torch.Tensor, keep_frac: float = 1.0) -> torch.Tensor:
    """DAPO dynamic sampling (arXiv 2503.14476): drop groups whose valid rewards are all
    equal. The trainer then samples more prompts until the step is full."""
    return group_stats(r).has_signal[:, 0]                           # [P]


@register("starpo")
def top_spread(r: torch.Tensor, keep_frac: float = 0.5) -> torch.Tensor:
    """StarPO-S uncertainty filtering (RAGEN, arXiv 2504.20073): keep the fraction
    `keep_frac` of groups with the highest reward std (at least one; ties by index)."""
    if not 0 < keep_frac <= 1:
        raise ValueError(f"algo.filter.keep_frac must be in (0, 1], got {keep_frac}")
    p = r.shape[0]
    k = max(1, math.ceil(keep_frac * p - 1e-9))
    order = torch.sort(group_spread(r), descending=True, stable=True).indices  # [P]
    keep = torch.zeros(p, dtype=torch.bool)
    keep[order[:k]] = True
    return keep


def best_and_worst(r: torch.Tensor, k: int) -> torch.Tensor:
    """Best-of-N (DanceGRPO, arXiv 2505.07818): per group, the k highest and k lowest
    valid rewards. r [P, G] -> column indices [P, 2k] (highest first). Groups with fewer
    than 2k valid rewards are filled with their unscorable samples (advantage 0 anyway)."""
    p, g = r.shape
    if not 1 <= k <= g // 2:
        raise ValueError(f"algo.best_worst_k must be between 1 and group_size/2 = {g // 2}, got {k}")
    rows = []
    for row in r:                                                       # [G]
        valid = ~torch.isnan(row)
        order = torch.sort(torch.where(valid, row, -torch.inf), descending=True, stable=True).indices
        n_valid = int(valid.sum())
        ranked = order[:n_valid].tolist()                               # valid, best first
        if n_valid >= 2 * k:
            chosen = ranked[:k] + ranked[n_valid - k:]
        else:
            chosen = ranked + order[n_valid:n_valid + 2 * k - n_valid].tolist()
        rows.append(chosen)
    return torch.tensor(rows, dtype=torch.long)                         # [P, 2k]
