"""Score samples with every configured reward, isolating failures.

The rewards of a batch run concurrently (the first on the calling thread, each other one on a worker
thread of its own), so a reward that waits (a remote server, a model that releases the GIL) overlaps
with the others; each reward's wall time is reported as `time/reward/<label>_s`.

A reward that raises, times out, or returns None/NaN for a sample marks that sample
unscorable for that reward (NaN in the score matrix: no group statistics, advantage 0
for it) and is counted in `reward/<label>/failed`. A reward that returns the wrong number
of scores, or fails on more than `max_fail_frac` of a batch, raises `RewardError`,
which stops training (the last checkpoint stands).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from rewards.registry import resolve
from rewards.styles import check_style

log = logging.getLogger("mmrl.rewards")
RESERVED = ("name", "weight", "label", "timeout_s", "max_fail_frac", "style")


class RewardError(RuntimeError):
    """A reward is broken beyond per-sample isolation; training must stop."""


@dataclass(frozen=True)
class RewardSpec:
    name: str                       # registered name, module:function or file.py:function
    label: str                      # the name used in metrics: reward/<label>/mean
    weight: float = 1.0
    timeout_s: float | None = None  # a batch call slower than this fails for all its samples
    max_fail_frac: float = 0.5      # more failed samples than this in one batch stops training
    kwargs: dict = None
    style: str = "auto"             # how the function is called: mmrl | trl | verl | easyr1 | ... (styles.py)


def parse_specs(entries: list[Any], key: str = "rewards") -> list[RewardSpec]:
    """Config `rewards:` list (or another list of reward entries, at config key `key`) -> specs; errors
    name the entry and the key."""
    specs, labels = [], set()
    for i, e in enumerate(entries):
        if isinstance(e, str):
            e = {"name": e}
        if not isinstance(e, dict) or "name" not in e:
            raise ValueError(f"config key '{key}[{i}]' must be a mapping with a 'name', got {e!r}")
        e = dict(e)
        name = str(e["name"])
        label = str(e.get("label") or name.rsplit(":", 1)[-1])
        if label in labels:
            raise ValueError(f"config key '{key}[{i}]': label {label!r} is used twice; set 'label:' to tell them apart")
        labels.add(label)
        try:
            weight = float(e.get("weight", 1.0))
            timeout = None if e.get("timeout_s") is None else float(e["timeout_s"])
            frac = float(e.get("max_fail_frac", 0.5))
        except (TypeError, ValueError) as err:
            raise ValueError(f"config key '{key}[{i}]' ({name}): weight, timeout_s and max_fail_frac must be numbers: {err}")
        kwargs = {k: v for k, v in e.items() if k not in RESERVED}
        style = check_style(str(e.get("style", "auto")), f"config key '{key}[{i}].style' ({name})")
        specs.append(RewardSpec(name, label, weight, timeout, frac, kwargs, style))
    return specs


class RewardSet:
    """The run's rewards, built once. `score(samples) -> (scores [N, K], metrics)`."""

    def __init__(self, specs: list[RewardSpec]):
        self.specs = specs
        self.fns: list[Callable] = []
        for s in specs:
            try:
                self.fns.append(resolve(s.name, s.kwargs, s.style))
            except ValueError as e:
                raise ValueError(f"reward {s.label!r}: {e}") from None
        self._seen_errors: set[tuple[str, str]] = set()
        self._timeout_pools = {s.label: _pool(f"mmrl-reward-{s.label}") for s in specs if s.timeout_s is not None}
        self._others = _pool("mmrl-rewards", max(1, len(specs) - 1))         # every reward but the first

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.specs]

    @property
    def weights(self) -> list[float]:
        return [s.weight for s in self.specs]

    def _call(self, spec: RewardSpec, fn: Callable, samples: list) -> list:
        if spec.timeout_s is None:
            return fn(samples)
        future = self._timeout_pools[spec.label].submit(fn, samples)
        try:
            return future.result(timeout=spec.timeout_s)
        except cf.TimeoutError:
            # the stuck call keeps its thread; later calls get a fresh pool
            self._timeout_pools[spec.label] = _pool(f"mmrl-reward-{spec.label}")
            raise TimeoutError(f"reward {spec.label!r} took longer than timeout_s={spec.timeout_s}")

    def _note(self, spec: RewardSpec, err: BaseException, sample_id: str) -> None:
        key = (spec.label, type(err).__name__)
        if key not in self._seen_errors:
            self._seen_errors.add(key)
            log.warning("reward %r failed on %s: %s: %s (further %s errors of this reward are counted, not logged)",
                        spec.label, sample_id or "a sample", type(err).__name__, err, type(err).__name__)

    def _score_one(self, spec: RewardSpec, fn: Callable, samples: list) -> tuple[list, BaseException | None]:
        """Batch call; if it raises, one call per sample to isolate the bad ones (each logged once per type)."""
        values, errors, first = score_isolated(
            lambda batch: self._check_length(spec, self._call(spec, fn, batch), len(batch)), samples)
        for s, err in zip(samples, errors):
            if err is not None:
                self._note(spec, err, s.id)
        return values, first

    @staticmethod
    def _check_length(spec: RewardSpec, values, n: int) -> list:
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise RewardError(f"reward {spec.label!r} returned {got} scores for {n} samples; "
                              "a reward must return one float or None per sample")
        return list(values)

    def _timed(self, spec: RewardSpec, fn: Callable, samples: list) -> tuple[list, BaseException | None, float]:
        t0 = time.perf_counter()
        values, first_err = self._score_one(spec, fn, samples)
        return values, first_err, time.perf_counter() - t0

    def score(self, samples: list) -> tuple[torch.Tensor, dict]:
        """Every reward on `samples`, concurrently: the first on this thread (math-verify's timeouts
        need the main thread), the others each on a worker thread; results in the configured order."""
        n = len(samples)
        rest = [self._others.submit(self._timed, spec, fn, samples) for spec, fn in zip(self.specs[1:], self.fns[1:])]
        results = [self._timed(self.specs[0], self.fns[0], samples)] if self.specs else []
        results += [f.result() for f in rest]
        columns, metrics = [], {}
        for spec, (values, first_err, seconds) in zip(self.specs, results):
            col = [_as_float(v) for v in values]
            failed = sum(math.isnan(v) for v in col)
            if n and failed / n > spec.max_fail_frac:
                cause = f"; first error: {type(first_err).__name__}: {first_err}" if first_err else ""
                raise RewardError(f"reward {spec.label!r} failed on {failed} of {n} samples "
                                  f"(more than max_fail_frac={spec.max_fail_frac}){cause}")
            good = [v for v in col if not math.isnan(v)]
            # plain numbers: the trainer declares how each combines over processes
            # (mmrl/loop/collect.py SCORER_METRICS); a new metric here needs a row there
            metrics[f"reward/{spec.label}/mean"] = sum(good) / len(good) if good else float("nan")
            metrics[f"reward/{spec.label}/failed"] = failed                  # a count
            metrics[f"time/reward/{spec.label}_s"] = seconds                  # wall time of its call(s)
            columns.append(col)
        scores = torch.tensor(columns, dtype=torch.float32).T.reshape(n, len(self.specs))  # [N, K]
        return scores, metrics


def score_isolated(call: Callable[[list], list], samples: list) -> tuple[list, list, BaseException | None]:
    """`call(samples)`, or where it raises, `call([s])` for each sample: (values, each sample's error or None,
    the batch call's error). A sample whose own call raises scores None. RewardError passes through; a
    TimeoutError of the batch call fails every sample (a per-sample retry would wait once per sample).
    The scorer and the reward server (rewards/server.py) isolate failures with it."""
    n = len(samples)
    try:
        return list(call(samples)), [None] * n, None
    except RewardError:
        raise
    except TimeoutError as e:
        return [None] * n, [e] * n, e
    except Exception as e:  # noqa: BLE001  (isolation is the point)
        first = e
    values, errors = [], []
    for s in samples:
        try:
            values += call([s])
            errors.append(None)
        except RewardError:
            raise
        except Exception as e:  # noqa: BLE001
            values.append(None)
            errors.append(e)
    return values, errors, first


def _pool(name: str, workers: int = 1) -> cf.ThreadPoolExecutor:
    return cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)


def _as_float(v) -> float:
    if v is None:
        return float("nan")
    if isinstance(v, bool):
        return float(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f if math.isfinite(f) else float("nan")
