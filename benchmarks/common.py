"""Shared by the benchmarks: the command-line harness, interleaved timing, medians, a plain-text table.

Each benchmark times its contenders in turn inside one loop (A, B, A, B, ...), so a slow
patch of the machine hits both, and reports medians after warm-up. `run` is every script's
`main`: it parses the command line (`--repeats` plus the script's own options), seeds torch,
prints the tables the script measured (a blank line between) and ends with the `headline:` line.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Report:
    """What one benchmark run prints: its tables (`table` strings) and the headline after them."""

    tables: list[str]
    headline: str


def run(doc: str, add_options: Callable[[argparse.ArgumentParser], None],
        measure: Callable[[argparse.Namespace], Report], quiet: bool = False) -> None:
    """The harness of every benchmark script: `doc`'s first line is the `--help` description."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10, help="timed calls per contender (after warm-up)")
    add_options(ap)
    args = ap.parse_args()
    if quiet:
        silence_libraries()
    torch.manual_seed(0)
    report = measure(args)
    print("\n\n".join(report.tables))
    print(f"headline: {report.headline}")


def silence_libraries() -> None:
    """Hide library warnings and info logs, which would interleave with the tables."""
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    try:
        import transformers
    except ImportError:
        return
    transformers.logging.set_verbosity_error()


def pair_rows(label: str, times: dict[str, list]) -> tuple[list[list], float]:
    """Table rows of two timed contenders (mmrl first, its baseline second) and mmrl / baseline."""
    (a, ta), (b, tb) = times.items()
    ratio = median(ta) / median(tb)
    return [[label, a, median(ta), ratio], [label, b, median(tb), 1.0]], ratio


def cases_headline(what: str, rows: list[list], goal: str) -> str:
    """'<what> = <ratio> at <last case> (goal ...); all cases: ...' from rows whose first cell is
    the case and whose last cell is the ratio."""
    return (f"{what} = {rows[-1][-1]:.3f} at {rows[-1][0]} ({goal}); all cases: "
            + ", ".join(f"{r[0]} {r[-1]:.3f}" for r in rows))


def table(title: str, header: list[str], rows: list[list]) -> str:
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells[1:]]
    return "\n".join(lines)


def diffusion_options(ap: argparse.ArgumentParser) -> None:
    """The options of both diffusion benchmarks."""
    ap.add_argument("--steps", type=int, default=10, help="denoising steps per image (all trained)")
    ap.add_argument("--group", type=int, default=8, help="images per prompt")


def tiny_diffusion_policy(kind: str, overrides: list[str]):
    """A built diffusion policy on a tiny model of `kind` (sd3 | sd | flux | wan) and its config."""
    from mmrl.config import load_config
    from mmrl.config.policies import BuildContext, build_policy

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = load_config(os.path.join(repo, "configs", "tiny", f"{kind}_tiny.yaml"), list(overrides))
    ctx = BuildContext(device=torch.device("cpu"), seed=cfg.seed, output_dir="/tmp", precision="fp32",
                       kl_beta=cfg.algo.kl_beta)
    return build_policy(cfg.policy, ctx), cfg
