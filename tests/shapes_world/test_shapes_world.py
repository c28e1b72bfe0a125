"""The shapes world's generators: deterministic scenes, held-out splits, right answers, the dataset
stand-ins, and one palette shared by every generator and the verifier."""

import io
import os
import re

import numpy as np
import pytest
from PIL import Image

from rewards.shapes import palette
from rewards.shapes.verify import find_blobs
from shapes_world import scene as scene_module
from shapes_world.scene import SHAPES, Scene, Shape, render, sample_scene
from shapes_world.standins import counting, grounding
from shapes_world.tasks import t2i_prompt_space, t2i_records, vlm_records

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("mmrl", "vlm", "diffusion", "rewards", "shapes_world", "benchmarks")


def _colours(image) -> set[tuple[int, int, int]]:
    arr = np.asarray(image.convert("RGB")).reshape(-1, 3)                     # [H * W, 3]
    return {tuple(int(v) for v in px) for px in np.unique(arr, axis=0)}


def _png(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def test_scenes_are_determined_by_seed():
    assert sample_scene(3) == sample_scene(3)
    assert render(sample_scene(3)).tobytes() == render(sample_scene(3)).tobytes()
    assert sample_scene(3) != sample_scene(4)


def test_splits_are_disjoint():
    train = {r["scene_seed"] for r in vlm_records(50, "train")}
    evals = {r["scene_seed"] for r in vlm_records(50, "eval")}
    assert not train & evals
    t_train, t_eval = {r["prompt"] for r in t2i_records("train")}, {r["prompt"] for r in t2i_records("eval")}
    assert not t_train & t_eval and t_eval
    assert len(t_train | t_eval) == len(t2i_prompt_space())


def test_vlm_answers_are_right_for_the_scene():
    for r in vlm_records(40, "train", ["count", "attribute", "relation", "grounding"]):
        scene = sample_scene(r["scene_seed"])
        if r["task"] == "count":
            color = r["prompt"].split()[2]
            assert int(r["answer"]) == sum(s.color == color for s in scene.shapes)
        if r["task"] == "grounding":
            assert tuple(r["answer"]) in {s.box for s in scene.shapes}


def test_t2i_records_repeats_the_split_for_multi_seed_evaluation():
    once, four = t2i_records("eval"), t2i_records("eval", repeats=4)
    assert four == once * 4 and four[0] is not four[len(once)]
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        t2i_records("eval", repeats=0)


def test_the_generators_draw_with_the_palette_the_verifier_reads():
    assert scene_module.COLORS is palette.COLORS and scene_module.BACKGROUND is palette.BACKGROUND
    allowed = set(palette.COLORS.values()) | {palette.BACKGROUND}
    for r in vlm_records(24, "train"):
        assert _colours(r["images"][0]) <= allowed
    for r in counting(n=6, seed=0) + grounding(n=4, seed=0):
        assert _colours(_png(r["images"][0])) <= allowed
    for color, rgb in palette.COLORS.items():
        for kind in SHAPES:
            image = render(Scene(32, (Shape(kind, color, (4, 4, 14, 14)),)))
            assert _colours(image) == {rgb, palette.BACKGROUND}, (color, kind)
            assert [(b.color, b.kind) for b in find_blobs(image)] == [(color, kind)]


def test_colour_names_map_to_rgb_in_one_module_only():
    table = re.compile(r"""["']red["']\s*:\s*\(""")
    found = []
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as f:
                        if table.search(f.read()):
                            found.append(os.path.relpath(path, REPO))
    assert found == [os.path.join("rewards", "shapes", "palette.py")]


def test_standin_answers_match_their_pixels():
    (row,) = grounding(n=1, seed=3, width=90, height=70)
    arr = np.asarray(_png(row["images"][0]).convert("RGB"))                    # [70, 90, 3]
    ys, xs = np.nonzero((arr == palette.COLORS["red"]).all(-1))
    assert [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1] == row["answer"]   # x2, y2 exclusive
    assert _png(row["images"][0]).size == (90, 70)
    for r in counting(n=8, seed=1, max_count=3):
        blobs = find_blobs(_png(r["images"][0]))
        assert len(blobs) == int(r["answer"]) and {b.kind for b in blobs} == {"square"}


def _default_data(key: str) -> dict:
    import yaml

    with open(os.path.join(REPO, "configs", "tiny", "vlm_shapes.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f)["data"][key]


@pytest.mark.parametrize("split", ["train_kwargs", "eval_kwargs"])
def test_a_constant_answer_scores_at_most_a_quarter_on_each_question_kind_of_the_vlm_default(split):
    """Every constant reply, scored by the default's own verifier, on the default's train and held-out
    questions: at most 1/4 per kind (count 0-3 and the four colours are drawn equally often)."""
    from rewards.sample import Sample
    from rewards.shapes.verify import shapes_vlm

    records = vlm_records(**_default_data(split))
    assert {r["task"] for r in records} == {"count", "attribute"}
    for task in ("count", "attribute"):
        mine = [r for r in records if r["task"] == task]
        golds = sorted({r["answer"] for r in mine})
        assert golds == (["0", "1", "2", "3"] if task == "count" else sorted(palette.COLORS)), golds
        for constant in golds + ["4", "purple"]:
            scores = shapes_vlm([Sample(r["prompt"], f"<answer>{constant}</answer>", answer=r["answer"],
                                        meta={"task": task}) for r in mine])
            assert sum(scores) / len(scores) <= 0.25, (split, task, constant)


def test_balanced_questions_are_conditioned_scenes_and_the_unbalanced_draw_is_kept():
    """Balanced: each answer equally often, each still right for its scene; balanced=False: the scenes'
    own answer distribution (counts skew to 0 and 1), as before balancing."""
    from collections import Counter

    records = vlm_records(96, "train", ["count", "attribute", "relation"], max_objects=3)
    for task, space in (("count", "0123"), ("attribute", list(palette.COLORS)), ("relation", ["yes", "no"])):
        counts = Counter(r["answer"] for r in records if r["task"] == task)
        assert sorted(counts) == sorted(space) and len(set(counts.values())) == 1, (task, counts)
    for r in records:
        scene = sample_scene(r["scene_seed"], 56, 3)
        if r["task"] == "count":
            assert int(r["answer"]) == sum(s.color == r["prompt"].split()[2] for s in scene.shapes)
        if r["task"] == "attribute":
            kind = r["prompt"].split()[-1].rstrip("?")
            assert [s.color for s in scene.shapes if s.kind == kind] == [r["answer"]]
        if r["task"] == "relation":
            words = r["prompt"].split()
            a, b = (words[2], words[3]), (words[7], words[8].rstrip("?"))
            (xa,), (xb,) = ([s.center[0] for s in scene.shapes if (s.color, s.kind) == k] for k in (a, b))
            assert r["answer"] == ("yes" if xa < xb else "no")
    natural = Counter(r["answer"] for r in vlm_records(400, "train", ["count"], max_objects=3, balanced=False))
    assert natural["0"] > 2 * natural["2"] and natural["3"] < natural["2"], natural
