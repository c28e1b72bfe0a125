"""Latency for benchmarks/async_vs_sync.py, loaded by path from its config overrides: an environment whose step
waits like a sandbox or a web tool, and a reward that waits like a judge model served elsewhere."""

from __future__ import annotations

import time

from envs.frozenlake import FrozenLake


class SlowFrozenLake(FrozenLake):
    """FrozenLake whose every step first waits `latency_s` seconds (a remote environment's round trip)."""

    def __init__(self, *, latency_s: float = 0.05, **kwargs):
        super().__init__(**kwargs)
        self.latency_s = latency_s

    def step(self, action: str):
        time.sleep(self.latency_s)
        return super().step(action)


def judge_latency(samples: list, *, latency_s: float = 0.3) -> list:
    """A reward call that waits `latency_s` seconds per batch and scores 0 (weight it 0: it only costs time,
    as a judge served over HTTP would)."""
    time.sleep(latency_s)
    return [0.0] * len(samples)
