"""Prompt records and the resumable sampler that picks each step's prompts.

A source is a `.jsonl`, `.json` (a list of objects) or `.parquet` file, or
`module:function` / `path/to/file.py:function` returning a list of dicts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from mmrl.config import ConfigError


def _read_jsonl(path: str) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}, line {line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ConfigError(f"{path}, line {line_no}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _call_source(ref: str, kwargs: dict) -> list[dict]:
    from rewards.registry import _load_object  # same module:function / file.py:function rules

    try:
        fn = _load_object(ref)
    except ValueError as e:
        raise ConfigError(f"data source: {e}") from None
    try:
        rows = fn(**kwargs)
    except (TypeError, ValueError, FileNotFoundError) as e:
        raise ConfigError(f"data source {ref!r} with arguments {sorted(kwargs)} failed: {e}") from None
    return list(rows)


def load_records(source: str, kwargs: dict | None = None, field: str = "data.train") -> list[dict]:
    """Read the records of a data source; errors name the file, line or field."""
    kwargs = dict(kwargs or {})
    if source.endswith(".jsonl"):
        rows = _read_jsonl(_existing(source, field))
    elif source.endswith(".json"):
        with open(_existing(source, field), encoding="utf-8") as f:
            try:
                rows = json.load(f)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{source}, line {e.lineno}: not valid JSON ({e.msg})") from None
    elif source.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows = pq.read_table(_existing(source, field)).to_pylist()
    elif ":" in source:
        rows = _call_source(source, kwargs)
    else:
        raise ConfigError(f"config key '{field}': {source!r} is not a .jsonl/.json/.parquet file "
                          "nor a 'module:function' source")
    if not rows:
        raise ConfigError(f"config key '{field}': source {source!r} holds no records")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"{source}, record {i}: expected a mapping, got {type(row).__name__}")
    return rows


def _existing(path: str, field: str) -> str:
    if not os.path.isfile(path):
        raise ConfigError(f"config key '{field}': file {path!r} does not exist")
    return path


@dataclass
class PromptSampler:
    """Epoch-wise shuffled dataset indices, identical on every process and resumable.

    The permutation of epoch e is drawn from a generator seeded with (seed, e); the state
    is (epoch, position), saved in checkpoints.
    """

    size: int
    seed: int
    epoch: int = 0
    position: int = 0

    def _perm(self) -> list[int]:
        cached = getattr(self, "_cache", None)
        if cached is None or cached[0] != self.epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            self._cache = (self.epoch, torch.randperm(self.size, generator=gen).tolist())
        return self._cache[1]

    def take(self, k: int) -> list[int]:
        if self.size < 1:
            raise ValueError("cannot sample prompts from an empty dataset")
        out: list[int] = []
        while len(out) < k:
            perm = self._perm()
            n = min(k - len(out), self.size - self.position)
            out += perm[self.position:self.position + n]
            self.position += n
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def prompt_seed(seed: int, step: int, position: int) -> int:
    """Seed of one prompt's sampling, from (run seed, step, position in the global batch)."""
    return (seed * 1_000_003 + step * 10_007 + position) % (2**63 - 1)
