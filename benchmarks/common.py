"""Shared timing helpers: interleaved runs, medians, a plain-text table.

Each benchmark times its contenders in turn inside one loop (A, B, A, B, ...), so a slow
patch of the machine hits both, and reports medians after warm-up.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable

import torch


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads")


def interleaved(contenders: dict[str, Callable[[], object]], repeats: int = 10, warmup: int = 2) -> dict[str, list]:
    """Seconds per call of each contender, alternating calls; warm-up calls are discarded."""
    times: dict[str, list] = {name: [] for name in contenders}
    for i in range(warmup + repeats):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def median(xs: list) -> float:
    return statistics.median(xs)


def table(title: str, header: list[str], rows: list[list]) -> str:
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells[1:]]
    return "\n".join(lines)


def tiny_diffusion_policy(kind: str, overrides: list[str]):
    """A built diffusion policy on a tiny model of `kind` (sd3 | sd | flux) and its config."""
    from mmrl.config import load_config
    from mmrl.policies import BuildContext, build_policy

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(os.path.join(repo, "configs", "tiny", f"{kind}_tiny.yaml"), list(overrides))
    ctx = BuildContext(torch.device("cpu"), cfg.seed, "/tmp", "fp32", None, cfg.algo.kl_beta)
    return build_policy(cfg.policy, ctx), cfg
