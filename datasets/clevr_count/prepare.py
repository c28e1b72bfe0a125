"""Convert the CLEVR v1.0 release to counting records (see README.md).

Reads <clevr>/questions/CLEVR_<split>_questions.json (mode `questions`: the questions whose program
ends in `count`, e.g. "How many red cubes are there?") or <clevr>/scenes/CLEVR_<split>_scenes.json
(mode `total`: "How many objects are in the image?", the R1-V / CLEVR-CoGenT counting task), and
writes <output>/{train,val}.jsonl with image paths relative to the output folder.

    python datasets/clevr_count/prepare.py --clevr ~/downloads/CLEVR_v1.0 --output data/clevr_count
"""

from __future__ import annotations

import argparse
import json
import os

TOTAL_PROMPT = "How many objects are in the image? Answer with a number."


def _image(clevr: str, split: str, filename: str, output: str) -> str:
    return os.path.relpath(os.path.join(clevr, "images", split, filename), output)


def _last_function(program: list) -> str:
    step = program[-1] if program else {}
    return str(step.get("function", step.get("type", "")))


def from_questions(clevr: str, split: str, output: str, limit: int | None = None) -> list[dict]:
    with open(os.path.join(clevr, "questions", f"CLEVR_{split}_questions.json"), encoding="utf-8") as f:
        questions = json.load(f)["questions"]
    rows = []
    for q in questions:
        if _last_function(q.get("program", [])) != "count":
            continue
        rows.append({"prompt": q["question"] + " Answer with a number.",
                     "images": [_image(clevr, split, q["image_filename"], output)], "answer": str(q["answer"]),
                     "question_family": q.get("question_family_index"), "image_index": q.get("image_index")})
        if limit and len(rows) >= limit:
            break
    return rows


def from_scenes(clevr: str, split: str, output: str, limit: int | None = None) -> list[dict]:
    with open(os.path.join(clevr, "scenes", f"CLEVR_{split}_scenes.json"), encoding="utf-8") as f:
        scenes = json.load(f)["scenes"]
    rows = [{"prompt": TOTAL_PROMPT, "images": [_image(clevr, split, s["image_filename"], output)],
             "answer": str(len(s["objects"])), "image_index": s.get("image_index")} for s in scenes]
    return rows[:limit] if limit else rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clevr", required=True, help="the unpacked CLEVR_v1.0 folder")
    ap.add_argument("--output", required=True)
    ap.add_argument("--mode", choices=["questions", "total"], default="total")
    ap.add_argument("--splits", nargs="+", default=["train", "val"])
    ap.add_argument("--limit", type=int, default=None, help="keep at most this many records per split")
    args = ap.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    build = from_questions if args.mode == "questions" else from_scenes
    for split in args.splits:
        rows = build(args.clevr, split, args.output, args.limit)
        path = os.path.join(args.output, f"{split}.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        print(f"{path}: {len(rows)} records")


if __name__ == "__main__":
    main()
