"""VLM dataset sources: read JSONL / JSON / Parquet files (the core's `mmrl.data.read_table`) or
Hugging Face datasets, convert rows to the mmrl schema (`vlm.converters`), validate them, and
resolve image paths.

Use it from a config as a `module:function` source:

    data:
      train: vlm.data:load
      train_kwargs: {path: data/geo3k/train.parquet, format: auto, skip_bad_rows: true}

`path` is a .jsonl/.json/.parquet file, a folder saved with `datasets.save_to_disk`
(read with `load_from_disk`), a folder of data files (read with `datasets.load_dataset`),
or `hf:<name>` (a hub dataset, `datasets.load_dataset(name)`); the last two need the
`datasets` package, imported only then. Relative image paths are resolved against the
dataset file's folder (or `image_root`). Images stay references (decoded at rollout).

A bad row (empty prompt, missing answer, missing or corrupt image, a row the converter
cannot read) raises an error naming the file and row; `skip_bad_rows=true` drops such rows
instead, logs how many and why, and keeps going.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from mmrl.config import ConfigError
from mmrl.data import FILE_SUFFIXES, TableError, read_table
from vlm.converters import IMAGE_MARK, RowError, converter, detect
from vlm.images import ImageError, check_image

log = logging.getLogger("mmrl.vlm.data")
SOURCE_KEY, ROW_KEY = "_source", "_row"   # provenance columns added to every record (not passed as meta)


class DataError(ConfigError):
    """A dataset problem; the message names the file and row."""


@dataclass
class LoadReport:
    """What a load kept and skipped (`skipped` holds "row N: reason" lines)."""

    source: str
    kept: int = 0
    skipped: list = field(default_factory=list)


def where(row: dict) -> str:
    """"file, row N" of a record, for error messages (records without provenance say so)."""
    src, i = row.get(SOURCE_KEY), row.get(ROW_KEY)
    if src is None:
        return "a dataset record" if i is None else f"dataset record {i}"
    return f"{src}, row {i}"


def _read_hf(path: str, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        datasets = None
    if not hasattr(datasets, "load_dataset"):  # absent, or the repo's datasets/ recipes folder found instead
        raise DataError(f"reading {path!r} needs the 'datasets' package (pip install datasets), "
                        "or convert it to .jsonl/.parquet first")
    if path.startswith("hf:"):
        ds = datasets.load_dataset(path[3:], split=split)
    elif any(os.path.isfile(os.path.join(path, n)) for n in ("dataset_info.json", "dataset_dict.json", "state.json")):
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"{path}: no split {split!r}; splits are {sorted(ds)}")
            ds = ds[split]
    else:
        ds = datasets.load_dataset(path, split=split)
    for name, feature in ds.features.items():  # keep images as {bytes, path} references (lazy decoding)
        if isinstance(feature, datasets.Image):
            ds = ds.cast_column(name, datasets.Image(decode=False))
        elif isinstance(getattr(feature, "feature", None), datasets.Image):
            ds = ds.cast_column(name, datasets.Sequence(datasets.Image(decode=False)))
        elif isinstance(feature, list) and feature and isinstance(feature[0], datasets.Image):
            ds = ds.cast_column(name, [datasets.Image(decode=False)])
    return ds.to_list()


def read_rows(path: str, split: str = "train") -> list:
    """Raw rows of a source (no conversion)."""
    if path.startswith("hf:") or os.path.isdir(path):
        return _read_hf(path, split)
    if not os.path.isfile(path):
        raise DataError(f"dataset file {path!r} does not exist")
    if not path.endswith(FILE_SUFFIXES):
        raise DataError(f"{path!r}: unsupported dataset file (use .jsonl, .json, .parquet or a datasets folder)")
    try:
        return read_table(path, mappings=False)  # a row that is not a mapping is a bad row (skippable)
    except TableError as e:
        if e.line is not None and e.row is not None:  # a JSONL line: say its row, as the row checks do
            raise DataError(f"{e.path}, row {e.row} (line {e.line}): {e.reason}") from None
        raise DataError(str(e)) from None


def _resolve(ref, root: str | None):
    if isinstance(ref, str) and root and not os.path.isabs(ref):
        return os.path.join(root, ref)
    if isinstance(ref, dict) and not ref.get("bytes") and isinstance(ref.get("path"), str) and root:
        return {**ref, "path": ref["path"] if os.path.isabs(ref["path"]) else os.path.join(root, ref["path"])}
    return ref


def check_record(rec: dict, require_answer: bool = True, images: bool = True, root: str | None = None) -> None:
    """Raise RowError if a normalised record cannot be trained on."""
    if not rec["prompt"].strip():
        raise RowError("empty prompt")
    if require_answer and rec.get("answer") is None:
        raise RowError("missing answer")
    marks = rec["prompt"].count(IMAGE_MARK)
    if marks and marks != len(rec["images"]):
        raise RowError(f"prompt has {marks} {IMAGE_MARK} marks but the row has {len(rec['images'])} images")
    if images:
        for k, ref in enumerate(rec["images"]):
            try:
                check_image(ref, root)
            except ImageError as e:
                raise RowError(f"image {k}: {e}") from None


def normalize(row, fmt: str, root: str | None, source: str, index: int) -> dict:
    """One raw row -> a schema record with provenance and resolved image paths."""
    if not isinstance(row, dict):
        raise RowError(f"expected a mapping, got {type(row).__name__}")
    rec = converter(detect(row) if fmt == "auto" else fmt)(row)
    rec["images"] = [_resolve(ref, root) for ref in rec["images"]]
    rec[SOURCE_KEY], rec[ROW_KEY] = source, index
    return rec


def load(path: str, format: str = "auto", split: str = "train", image_root: str | None = None,
         skip_bad_rows: bool = False, check_images: bool = True, require_answer: bool = True,
         max_rows: int | None = None) -> list[dict]:
    """Records of a VLM dataset in the mmrl schema (a `data.train` source; see the module doc)."""
    rows, report = load_with_report(path, format, split, image_root, skip_bad_rows, check_images,
                                    require_answer, max_rows)
    if report.skipped:
        log.warning("%s: skipped %d bad rows of %d (data.*_kwargs.skip_bad_rows=true); first: %s",
                    path, len(report.skipped), len(report.skipped) + report.kept, "; ".join(report.skipped[:3]))
    return rows


def load_with_report(path: str, format: str = "auto", split: str = "train", image_root: str | None = None,
                     skip_bad_rows: bool = False, check_images: bool = True, require_answer: bool = True,
                     max_rows: int | None = None) -> tuple[list[dict], LoadReport]:
    """`load`, also returning what was kept and skipped."""
    if format != "auto":
        try:
            converter(format)
        except ValueError as e:
            raise DataError(f"vlm.data.load format: {e}") from None
    raw = read_rows(path, split)
    if image_root:
        root = image_root
    elif os.path.isfile(path):
        root = os.path.dirname(os.path.abspath(path))
    else:
        root = os.path.abspath(path) if os.path.isdir(path) else None
    report, out = LoadReport(path), []
    for i, row in enumerate(raw[:max_rows] if max_rows else raw):
        try:
            rec = normalize(row, format, root, path, i)
            check_record(rec, require_answer, check_images)
        except RowError as e:
            if not skip_bad_rows:
                raise DataError(f"{path}, row {i}: {e} (set skip_bad_rows: true to drop bad rows)") from None
            report.skipped.append(f"row {i}: {e}")
            continue
        out.append(rec)
    report.kept = len(out)
    if not out:
        raise DataError(f"{path}: no usable rows ({len(report.skipped)} skipped)")
    return out, report
