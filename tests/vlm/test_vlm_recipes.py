"""Dataset converters (datasets/*/prepare.py) on fabricated miniature releases, and every VLM recipe
(configs/vlm/*.yaml) loaded and run for one step with its model swapped for a tiny one of the same
family and its data pointed at the miniature conversions (no downloads)."""

from __future__ import annotations

import glob
import importlib.util
import io
import json
import os
import pickle

import pytest
from PIL import Image

from mmrl.config import load_config
from vlm.data import load
from shapes_world.standins import counting, grounding

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = sorted(glob.glob(os.path.join(ROOT, "configs", "vlm", "*.yaml")))
TINY_FAMILY = {"Qwen2.5-VL": "tiny:qwen2_5_vl", "llava": "tiny:llava"}


def _script(name: str):
    path = os.path.join(ROOT, "datasets", name, "prepare.py")
    spec = importlib.util.spec_from_file_location(f"prepare_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _save(png: bytes, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(png)


def _fake_geometry3k(root: str) -> None:
    for split, rows in (("train", counting(n=3, seed=1)), ("test", counting(n=2, seed=2))):
        for i, r in enumerate(rows):
            folder = os.path.join(root, split, str(i))
            _save(r["images"][0], os.path.join(folder, "img_diagram.png"))
            with open(os.path.join(folder, "data.json"), "w") as f:
                json.dump({"id": i, "problem_text": "Find x.", "choices": ["1", "2", "3", "4"], "answer": "C"}, f)


def _fake_clevr(root: str) -> None:
    for split in ("train", "val"):
        rows, scenes, questions = counting(n=2, seed=3), [], []
        for i, r in enumerate(rows):
            name = f"CLEVR_{split}_{i:06d}.png"
            _save(r["images"][0], os.path.join(root, "images", split, name))
            scenes.append({"image_index": i, "image_filename": name, "objects": [{}] * int(r["answer"])})
            questions.append({"image_index": i, "image_filename": name, "question": "How many cubes?",
                              "answer": r["answer"], "program": [{"function": "scene"}, {"function": "count"}]})
            questions.append({"image_index": i, "image_filename": name, "question": "Is it red?", "answer": "no",
                              "program": [{"function": "scene"}, {"function": "exist"}]})
        for kind, payload in (("scenes", {"scenes": scenes}), ("questions", {"questions": questions})):
            os.makedirs(os.path.join(root, kind), exist_ok=True)
            with open(os.path.join(root, kind, f"CLEVR_{split}_{kind}.json"), "w") as f:
                json.dump(payload, f)


def _fake_refcoco(refer: str, coco: str) -> None:
    rows = grounding(n=3, seed=4)
    images, anns, refs = [], [], []
    for i, r in enumerate(rows):
        name = f"COCO_train2014_{i:012d}.jpg"
        Image.open(io.BytesIO(r["images"][0])).save(os.path.join(coco, name), format="JPEG")
        x1, y1, x2, y2 = r["answer"]
        images.append({"id": i, "file_name": name})
        anns.append({"id": 100 + i, "image_id": i, "bbox": [x1, y1, x2 - x1, y2 - y1]})
        refs.append({"ref_id": i, "ann_id": 100 + i, "image_id": i, "split": "train" if i else "val",
                     "sentences": [{"sent": "the red square"}, {"sent": "red box"}]})
    with open(os.path.join(refer, "refs(unc).p"), "wb") as f:
        pickle.dump(refs, f)
    with open(os.path.join(refer, "instances.json"), "w") as f:
        json.dump({"images": images, "annotations": anns}, f)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Run each prepare.py on its miniature release; returns dataset -> output folder."""
    tmp = tmp_path_factory.mktemp("releases")
    out = {name: str(tmp / "data" / name) for name in ("geometry3k", "clevr_count", "refcoco")}
    _fake_geometry3k(str(tmp / "geo"))
    _script("geometry3k").main(["--input", str(tmp / "geo"), "--output", out["geometry3k"]])
    _fake_clevr(str(tmp / "CLEVR_v1.0"))
    _script("clevr_count").main(["--clevr", str(tmp / "CLEVR_v1.0"), "--output", out["clevr_count"]])
    (tmp / "refer").mkdir()
    (tmp / "coco").mkdir()
    _fake_refcoco(str(tmp / "refer"), str(tmp / "coco"))
    _script("refcoco").main(["--refer", str(tmp / "refer"), "--coco", str(tmp / "coco"), "--output", out["refcoco"]])
    return out


def test_prepared_geometry3k(prepared):
    rows = load(os.path.join(prepared["geometry3k"], "train.parquet"))
    assert len(rows) == 3 and rows[0]["answer"] == "3" and rows[0]["answer_letter"] == "C"
    assert rows[0]["prompt"].startswith("<image>Find x.\nChoices: A. 1") and rows[0]["images"][0]["bytes"]


def test_prepared_clevr(prepared, tmp_path):
    rows = load(os.path.join(prepared["clevr_count"], "train.jsonl"))
    assert len(rows) == 2 and all(r["answer"] in "123" for r in rows) and os.path.isfile(rows[0]["images"][0])
    clevr = os.path.join(os.path.dirname(os.path.dirname(prepared["clevr_count"])), "CLEVR_v1.0")
    _script("clevr_count").main(["--clevr", clevr, "--output", str(tmp_path), "--mode", "questions", "--splits", "val"])
    qs = load(str(tmp_path / "val.jsonl"))
    assert len(qs) == 2 and all(q["prompt"].startswith("How many cubes?") for q in qs)


def test_prepared_refcoco_boxes_are_xyxy(prepared):
    rows = load(os.path.join(prepared["refcoco"], "train.jsonl"))
    gold = grounding(n=3, seed=4)
    assert len(rows) == 4 and rows[0]["answer"] == [float(v) for v in gold[1]["answer"]]
    assert rows[0]["prompt"] == "Locate the red square in the image." and rows[0]["ref_id"] == 1


def _tiny(model: str) -> str:
    for key, tiny in TINY_FAMILY.items():
        if key.lower() in model.lower():
            return tiny
    raise AssertionError(f"no tiny stand-in for {model!r}: add one to vlm/tiny.py and TINY_FAMILY")


def _data_for(recipe_cfg, prepared) -> str:
    path = recipe_cfg.data.train_kwargs["path"]
    for name, folder in prepared.items():
        if f"/{name}/" in f"/{path}":
            return os.path.join(folder, os.path.basename(path))
    raise AssertionError(f"recipe data {path!r} matches no prepared dataset")


@pytest.mark.parametrize("recipe", RECIPES, ids=[os.path.basename(r)[:-5] for r in RECIPES])
def test_recipe_runs_one_step_with_a_tiny_model(recipe, prepared, tmp_path):
    from mmrl.loop.trainer import train

    base = load_config(recipe)
    assert base.policy.name == "vlm" and base.data.train == "vlm.data:load"
    cfg = load_config(recipe, [
        f"policy.model={_tiny(base.policy.model)}", f"data.train_kwargs.path={_data_for(base, prepared)}",
        f"output_dir={tmp_path}", "max_steps=1", "precision=fp32", "data.eval=null", "eval.every=0",
        "checkpoint.every=0", "logging.save_samples_every=0", "policy.min_pixels=784", "policy.max_pixels=3136",
        "policy.max_new_tokens=4", "policy.max_prompt_tokens=512", "policy.generate_rows_per_call=0",
        "train.prompts_per_step=2", "train.group_size=2", "train.samples_per_microbatch=2",
        "train.grad_accum_steps=0"])
    train(cfg)
    with open(os.path.join(str(tmp_path), "metrics.jsonl")) as f:
        row = json.loads(f.readlines()[-1])
    assert row["step"] == 1 and "reward/mean" in row
    for spec in base.rewards:
        assert f"reward/{spec.get('label') or spec['name']}/mean" in row
