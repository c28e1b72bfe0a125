"""Convert a downloaded Geometry3k release to mmrl records (see README.md).

Two public layouts are recognised under --input:
  hf        the Hugging Face export hiyouga/geometry3k: Parquet files (data/{train,validation,test}-*.parquet)
            with `images` [{bytes, path}], `problem` (holding an <image> mark) and `answer`.
  intergps  the original release (InterGPS, Lu et al. 2021, arXiv 2105.04165): {train,val,test}/<id>/
            with data.json (`problem_text`, `choices`, `answer` letter) and img_diagram.png.
Output: <output>/{train,validation,test}.parquet with prompt, images (embedded PNG bytes), answer, and
`choices` / `answer_letter` / `source_id` as extra columns (passed to rewards as meta).

    python datasets/geometry3k/prepare.py --input ~/downloads/geometry3k --output data/geometry3k
"""

from __future__ import annotations

import argparse
import glob
import json
import os

SPLITS = {"train": "train", "validation": "validation", "val": "validation", "test": "test"}


def _hf_rows(parquet_files: list[str]) -> list[dict]:
    import pyarrow.parquet as pq

    rows = []
    for path in sorted(parquet_files):
        for r in pq.read_table(path).to_pylist():
            images = r.get("images") or ([r["image"]] if r.get("image") else [])
            prompt = r["problem"] if "<image>" in r["problem"] or not images else "<image>" + r["problem"]
            rows.append({"prompt": prompt, "images": images, "answer": str(r["answer"])})
    return rows


def _intergps_row(folder: str) -> dict:
    with open(os.path.join(folder, "data.json"), encoding="utf-8") as f:
        meta = json.load(f)
    with open(os.path.join(folder, "img_diagram.png"), "rb") as f:
        image = f.read()
    letters = "ABCD"
    choices = [str(c) for c in meta["choices"]]
    letter = str(meta["answer"]).strip().upper()
    if letter not in letters[:len(choices)]:
        raise ValueError(f"{folder}/data.json: answer {meta['answer']!r} is not one of {letters[:len(choices)]}")
    options = " ".join(f"{l}. {c}" for l, c in zip(letters, choices))
    return {"prompt": f"<image>{meta['problem_text']}\nChoices: {options}", "images": [{"bytes": image, "path": None}],
            "answer": choices[letters.index(letter)], "choices": choices, "answer_letter": letter,
            "source_id": str(meta.get("id", os.path.basename(folder)))}


def convert(input_dir: str) -> dict[str, list[dict]]:
    """split -> records, from either layout."""
    out: dict[str, list[dict]] = {}
    parquet = glob.glob(os.path.join(input_dir, "**", "*.parquet"), recursive=True)
    if parquet:
        for split in ("train", "validation", "test"):
            files = [p for p in parquet if os.path.basename(p).startswith(split)]
            if files:
                out[split] = _hf_rows(files)
        return out
    for name, split in SPLITS.items():
        folders = sorted(glob.glob(os.path.join(input_dir, name, "*", "data.json")))
        if folders:
            out[split] = [_intergps_row(os.path.dirname(p)) for p in folders]
    if not out:
        raise SystemExit(f"{input_dir}: found neither Parquet files (hiyouga/geometry3k) nor "
                         "{train,val,test}/<id>/data.json (InterGPS release)")
    return out


def write(splits: dict[str, list[dict]], output_dir: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(output_dir, exist_ok=True)
    paths = []
    for split, rows in splits.items():
        path = os.path.join(output_dir, f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
        paths.append(path)
        print(f"{path}: {len(rows)} records")
    return paths


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="the downloaded release (either layout)")
    ap.add_argument("--output", required=True, help="folder for {train,validation,test}.parquet")
    args = ap.parse_args(argv)
    write(convert(args.input), args.output)


if __name__ == "__main__":
    main()
