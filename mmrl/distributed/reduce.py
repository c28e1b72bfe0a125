"""Metrics that declare how they combine, and the one accumulator that combines them.

A metric is declared where it is computed, with its reduction:

    mean(x)               every contribution counts once (a loss per optimizer step, a time)
    summed(x)             summed (counts: failed rewards)
    maximum(x), minimum(x)
    weighted_mean(x, w)   mean weighted by w, e.g. a per-token fraction with w = its number
                          of tokens, so that clip_frac over microbatches (and processes) of
                          different sizes is the fraction over all their tokens; a
                          contribution with w = 0 (nothing counted, x may be NaN) is left out

`Accumulator.add` merges microbatches (or the metrics of the phases of a step),
`Accumulator.all_reduce` merges processes with one collective per operation (sum, max,
min; means travel as sums of numerator and denominator), and `Accumulator.result` is the
plain `dict[str, float]` row of metrics.jsonl. Every process must hold the same keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch

from mmrl.distributed.dist import all_reduce

REDUCTIONS = ("mean", "sum", "max", "min", "weighted_mean")


@dataclass(frozen=True)
class Metric:
    """One contribution to a metric: its value, its reduction and its weight (means only:
    the token count of a weighted mean; for a plain mean, how many contributions it stands for)."""

    value: float | int | torch.Tensor
    reduce: str = "mean"
    weight: float | torch.Tensor = 1.0

    def __post_init__(self):
        if self.reduce not in REDUCTIONS:
            raise ValueError(f"unknown metric reduction {self.reduce!r}; valid: {', '.join(REDUCTIONS)}")


def mean(x) -> Metric:
    return Metric(x, "mean")


def summed(x) -> Metric:
    return Metric(x, "sum")


def maximum(x) -> Metric:
    return Metric(x, "max")


def minimum(x) -> Metric:
    return Metric(x, "min")


def weighted_mean(x, weight) -> Metric:
    return Metric(x, "weighted_mean", weight)


def _host(metrics: Mapping[str, Metric]) -> dict[int, float]:
    """Every tensor value and weight as a Python float, one device-to-host copy per device
    (not one per metric), keyed by the tensor's id."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for m in metrics.values():
        for x in (m.value, m.weight):
            if isinstance(x, torch.Tensor):
                by_device.setdefault(x.device, []).append(x)
    out = {}
    for ts in by_device.values():
        values = torch.stack([t.detach().reshape(()).double() for t in ts]).tolist()
        out.update(zip(map(id, ts), values))
    return out


def _number(v, host: dict[int, float]) -> float | int:
    if isinstance(v, torch.Tensor):
        return host[id(v)]
    return v if isinstance(v, int) and not isinstance(v, bool) else float(v)


def _extremum(a: float, b: float, op: str) -> float:
    """max / min where a NaN wins (Python's max would depend on the order)."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b) if op == "max" else min(a, b)


@dataclass
class _State:
    """Running state of one key: `num` is the sum / the extremum / the weighted numerator,
    `den` the count or the total weight of the means; `ints`: every contribution was an int."""

    reduce: str
    num: float
    den: float
    ints: bool


class Accumulator:
    """Merges declared metrics over microbatches, then over processes."""

    def __init__(self):
        self._state: dict[str, _State] = {}

    def add(self, metrics: Mapping[str, Metric]) -> "Accumulator":
        for key, m in metrics.items():
            if not isinstance(m, Metric):
                raise TypeError(f"metric {key!r} is a {type(m).__name__}; declare its reduction with "
                                "mmrl.distributed.reduce.mean / summed / maximum / minimum / weighted_mean")
        host = _host(metrics)
        for key, m in metrics.items():
            self._merge(key, m, _number(m.value, host), float(_number(m.weight, host)))
        return self

    def _merge(self, key: str, m: Metric, v: float | int, w: float) -> None:
        num = v * w if m.reduce in ("mean", "weighted_mean") else v
        if m.reduce == "weighted_mean" and w == 0:
            num = 0.0                                  # nothing counted: NaN * 0 must not leak in
        s = self._state.get(key)
        if s is None:
            self._state[key] = _State(m.reduce, num, w, isinstance(v, int))
            return
        if s.reduce != m.reduce:
            raise ValueError(f"metric {key!r} is declared with reduction {m.reduce!r} here and {s.reduce!r} before")
        s.ints = s.ints and isinstance(v, int)
        if m.reduce in ("max", "min"):
            s.num = _extremum(s.num, num, m.reduce)
        else:
            s.num, s.den = s.num + num, s.den + w

    def all_reduce(self) -> "Accumulator":
        """Merge every process's state in place (a no-op on one process)."""
        keys = sorted(self._state)
        by_op = {"sum": [], "max": [], "min": []}
        for k in keys:
            s = self._state[k]
            if s.reduce in ("max", "min"):
                by_op[s.reduce].append((k, "num"))
            else:
                by_op["sum"] += [(k, "num"), (k, "den")]
        for op, slots in by_op.items():
            if not slots:
                continue
            values = all_reduce([getattr(self._state[k], f) for k, f in slots], op)
            for (k, f), v in zip(slots, values):
                setattr(self._state[k], f, v)
        return self

    def metrics(self) -> dict[str, Metric]:
        """The merged state as one declared metric per key (to merge further, e.g. over processes)."""
        value = self.result()
        return {k: Metric(value[k], s.reduce, s.den) for k, s in self._state.items()}

    def result(self) -> dict[str, float | int]:
        """The row: one plain number per key (NaN for a weighted mean that counted nothing)."""
        out = {}
        for k, s in self._state.items():
            v = s.num
            if s.reduce in ("mean", "weighted_mean"):
                v = s.num / s.den if s.den else math.nan
            out[k] = int(v) if s.ints and float(v).is_integer() else float(v)
        return out
