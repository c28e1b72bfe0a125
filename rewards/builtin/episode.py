"""Rewards of multi-turn episodes (the `env:` section): they read what the rollout recorded in
`Sample.meta` (`return`, `success`; see `mmrl.episodes.EpisodeMeta`). A sample that is not an
episode scores None (counted as unscorable)."""

from __future__ import annotations

from rewards.registry import register


@register("env_return")
def env_return(samples: list) -> list[float | None]:
    """The trajectory's return: the sum of its per-turn environment rewards (StarPO's trajectory reward)."""
    return [float(s.meta["return"]) if "return" in s.meta else None for s in samples]


@register("env_success")
def env_success(samples: list) -> list[float | None]:
    """1.0 when the episode ended solved (the environment's info["success"]), else 0.0."""
    return [float(bool(s.meta["success"])) if "success" in s.meta else None for s in samples]
