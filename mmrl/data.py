"""Prompt records and the resumable sampler that picks each step's prompts.

A source is a `.jsonl`, `.json` (a list of objects) or `.parquet` file, or
`module:function` / `path/to/file.py:function` returning a list of dicts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from mmrl.errors import ConfigError

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


class TableError(ConfigError):
    """A data file that cannot be read. The message names the file and, for one bad row, its line
    (JSONL) or record index (JSON); `path`, `reason`, `line` (1-based) and `row` (0-based) say the
    same for callers that phrase it their own way."""

    def __init__(self, path: str, reason: str, line: int | None = None, row: int | None = None):
        self.path, self.reason, self.line, self.row = path, reason, line, row
        at = f", line {line}" if line is not None else (f", record {row}" if row is not None else "")
        super().__init__(f"{path}{at}: {reason}")


def _read_jsonl(path: str, mappings: bool) -> list:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TableError(path, f"not valid JSON ({e.msg})", line_no, len(rows)) from None
            if mappings and not isinstance(row, dict):
                raise TableError(path, f"expected a JSON object, got {type(row).__name__}", line_no, len(rows))
            rows.append(row)
    return rows


def _read_json(path: str, mappings: bool) -> list:
    with open(path, encoding="utf-8") as f:
        try:
            rows = json.load(f)
        except json.JSONDecodeError as e:
            raise TableError(path, f"not valid JSON ({e.msg})", e.lineno) from None
    if not isinstance(rows, list):
        raise TableError(path, f"a .json data file must hold a list of records, not a {type(rows).__name__}")
    for i, row in enumerate(rows if mappings else []):
        if not isinstance(row, dict):
            raise TableError(path, f"expected a mapping, got {type(row).__name__}", row=i)
    return rows


def read_table(path: str, mappings: bool = True) -> list:
    """The rows of a .jsonl (one JSON value a line, blank lines skipped), .json (a list) or .parquet
    file, in file order. With `mappings`, a row that is not a JSON object is an error; without, such
    rows are returned for the caller to judge. Every error is a `TableError` naming the file."""
    if not path.endswith(FILE_SUFFIXES):
        raise TableError(path, "unsupported data file (use .jsonl, .json or .parquet)")
    if not os.path.isfile(path):
        raise TableError(path, "file does not exist")
    if path.endswith(".jsonl"):
        return _read_jsonl(path, mappings)
    if path.endswith(".json"):
        return _read_json(path, mappings)
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()  # a parquet row is always a mapping of its columns


def _call_source(ref: str, kwargs: dict) -> list[dict]:
    from mmrl.registry import load_object

    try:
        fn = load_object(ref)
    except ValueError as e:
        raise ConfigError(f"data source: {e}") from None
    try:
        rows = fn(**kwargs)
    except (TypeError, ValueError, FileNotFoundError) as e:
        raise ConfigError(f"data source {ref!r} with arguments {sorted(kwargs)} failed: {e}") from None
    return list(rows)


def check_source(source: str, kwargs: dict | None, field: str) -> None:
    """What can be checked of a data source without reading it: the file exists, or the
    'module:function' resolves to a callable that accepts the configured keyword arguments."""
    from mmrl.registry import is_reference, load_object, unexpected_kwargs

    if source.endswith(FILE_SUFFIXES):
        _existing(source, field)
        if kwargs:
            raise ConfigError(f"config key '{field}_kwargs' is for 'module:function' sources; "
                              f"{source!r} is a file and takes none (got {sorted(kwargs)})")
        return
    if not is_reference(source):
        raise ConfigError(f"config key '{field}': {source!r} is not a .jsonl/.json/.parquet file "
                          "nor a 'module:function' source")
    try:
        fn = load_object(source, field)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not callable(fn):
        raise ConfigError(f"config key '{field}': {source!r} is {type(fn).__name__}, not a function returning records")
    bad = unexpected_kwargs(fn, kwargs or {})
    if bad:
        raise ConfigError(f"config key '{field}_kwargs': {source!r} takes no argument {', '.join(map(repr, bad))}")


def load_records(source: str, kwargs: dict | None = None, field: str = "data.train") -> list[dict]:
    """Read the records of a data source; errors name the file, line or field."""
    kwargs = dict(kwargs or {})
    if source.endswith(FILE_SUFFIXES):
        rows = read_table(_existing(source, field))
    elif ":" in source:
        rows = _call_source(source, kwargs)
    else:
        raise ConfigError(f"config key '{field}': {source!r} is not a .jsonl/.json/.parquet file "
                          "nor a 'module:function' source")
    if not rows:
        raise ConfigError(f"config key '{field}': source {source!r} holds no records")
    for i, row in enumerate(rows):  # files are checked by read_table; a function's records here
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


def eval_seed(seed: int, index: int) -> int:
    """Seed of held-out record `index`'s evaluation output (e.g. its initial noise), from the run seed
    only, so every evaluation of a run (and every process) sees the same noise for that record."""
    return seed * 31 + index
