"""Convert a RefCOCO release to grounding records (see README.md).

Inputs (choose one):
  --refer <folder>  the `refer` release (Yu et al. 2016; github.com/lichengunc/refer) for refcoco:
                    refs(unc).p (pickle: ref_id, ann_id, image_id, split, sentences) and instances.json
                    (COCO boxes [x, y, w, h]); images from COCO train2014 given with --coco.
  --vlm-r1 <file>   a VLM-R1 style JSON list of {"image", "problem", "solution": [x1, y1, x2, y2]},
                    images under --coco.
Output: <output>/<split>.jsonl, one record per referring expression, answer [x1, y1, x2, y2] in the
original image's pixels, image paths relative to the output folder.

    python datasets/refcoco/prepare.py --refer ~/refer/data/refcoco --coco ~/coco/train2014 --output data/refcoco
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
from collections import defaultdict

PROMPT = "Locate {expr} in the image."


def _xyxy(box_xywh) -> list[float]:
    x, y, w, h = (float(v) for v in box_xywh)
    return [x, y, x + w, y + h]


def from_refer(refer: str, coco: str, output: str, splits_by: str = "unc") -> dict[str, list[dict]]:
    # The refer release ships its annotations as a Python pickle: load only files you downloaded yourself.
    with open(os.path.join(refer, f"refs({splits_by}).p"), "rb") as f:
        refs = pickle.load(f)
    with open(os.path.join(refer, "instances.json"), encoding="utf-8") as f:
        instances = json.load(f)
    boxes = {a["id"]: a["bbox"] for a in instances["annotations"]}
    files = {im["id"]: im["file_name"] for im in instances["images"]}
    out: dict[str, list[dict]] = defaultdict(list)
    for ref in refs:
        image = os.path.relpath(os.path.join(coco, files[ref["image_id"]]), output)
        for sent in ref["sentences"]:
            out[ref["split"]].append({"prompt": PROMPT.format(expr=sent["sent"]), "images": [image],
                                      "answer": _xyxy(boxes[ref["ann_id"]]), "ref_id": ref["ref_id"],
                                      "expression": sent["sent"]})
    return dict(out)


def from_vlm_r1(path: str, coco: str, output: str, split: str) -> dict[str, list[dict]]:
    with open(path, encoding="utf-8") as f:
        items = json.load(f)
    rows = [{"prompt": it["problem"], "images": [os.path.relpath(os.path.join(coco, it["image"]), output)],
             "answer": [float(v) for v in it["solution"]]} for it in items]
    return {split: rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--refer", help="folder with refs(<splits_by>).p and instances.json")
    src.add_argument("--vlm-r1", help="a VLM-R1 JSON file of {image, problem, solution}")
    ap.add_argument("--coco", required=True, help="the COCO image folder (train2014)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--splits-by", default="unc", help="refer split scheme: unc (RefCOCO, RefCOCO+) or umd (RefCOCOg)")
    ap.add_argument("--split", default="train", help="split name for --vlm-r1 input")
    args = ap.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    splits = (from_refer(args.refer, args.coco, args.output, args.splits_by) if args.refer
              else from_vlm_r1(args.vlm_r1, args.coco, args.output, args.split))
    for split, rows in sorted(splits.items()):
        path = os.path.join(args.output, f"{split}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"{path}: {len(rows)} records")


if __name__ == "__main__":
    main()
