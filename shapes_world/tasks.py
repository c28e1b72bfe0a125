"""Tasks over the shapes world, as dataset records (`data.train: shapes_world.tasks:...`).

VLM questions with verifiable answers: counting, attribute, relation, grounding.
Text-to-image prompts: a count of coloured shapes, optionally on one side.
Splits are fixed by seed: training scenes use seeds from 0, held-out ones from 10**6;
text-to-image prompts are split by a hash of the prompt, so no eval prompt is trained on.
"""

from __future__ import annotations

import hashlib
import random

from shapes_world.scene import COLORS, SHAPES, Scene, Shape, place, render, sample_scene

EVAL_SEED_BASE = 10**6
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}


def _count_question(rng: random.Random, scene: Scene) -> dict:
    color = rng.choice(list(COLORS))
    n = sum(s.color == color for s in scene.shapes)
    return {"task": "count", "prompt": f"How many {color} shapes are in the image?", "answer": str(n)}


def _attribute_question(rng: random.Random, scene: Scene) -> dict | None:
    unique = [s for s in scene.shapes if sum(t.kind == s.kind for t in scene.shapes) == 1]
    if not unique:
        return None
    s = rng.choice(unique)
    return {"task": "attribute", "prompt": f"What colour is the {s.kind}?", "answer": s.color}


def _relation_question(rng: random.Random, scene: Scene) -> dict | None:
    unique = [s for s in scene.shapes
              if sum((t.kind, t.color) == (s.kind, s.color) for t in scene.shapes) == 1]
    if len(unique) < 2:
        return None
    a, b = rng.sample(unique, 2)
    if abs(a.center[0] - b.center[0]) < 2:
        return None
    answer = "yes" if a.center[0] < b.center[0] else "no"
    return {"task": "relation", "prompt": f"Is the {a.color} {a.kind} left of the {b.color} {b.kind}? Answer yes or no.",
            "answer": answer}


def _grounding_question(rng: random.Random, scene: Scene) -> dict | None:
    unique = [s for s in scene.shapes
              if sum((t.kind, t.color) == (s.kind, s.color) for t in scene.shapes) == 1]
    if not unique:
        return None
    s = rng.choice(unique)
    return {"task": "grounding", "prompt": f"Give the bounding box [x1, y1, x2, y2] of the {s.color} {s.kind}.",
            "answer": list(s.box)}


QUESTIONS = {"count": _count_question, "attribute": _attribute_question,
             "relation": _relation_question, "grounding": _grounding_question}


def vlm_records(n: int = 256, split: str = "train", tasks: list | None = None, size: int = 56,
                max_objects: int = 4, seed: int = 0) -> list[dict]:
    """`n` records `{prompt, images: [PIL], answer, task, scene_seed}` for the given tasks."""
    tasks = list(tasks or ["count", "attribute", "relation"])
    unknown = [t for t in tasks if t not in QUESTIONS]
    if unknown:
        raise ValueError(f"unknown shapes task(s) {unknown}; valid: {', '.join(QUESTIONS)}")
    base = (EVAL_SEED_BASE if split == "eval" else 0) + seed * 100_003
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    out, i = [], 0
    while len(out) < n:
        scene_seed = base + i
        i += 1
        rng = random.Random(scene_seed * 7 + 1)
        scene = sample_scene(scene_seed, size, max_objects)
        q = QUESTIONS[tasks[len(out) % len(tasks)]](rng, scene)
        if q is not None:
            out.append({**q, "images": [render(scene)], "scene_seed": scene_seed})
    return out


def _is_eval_prompt(prompt: str, eval_fraction: float) -> bool:
    h = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return h < eval_fraction


def t2i_prompt_space(max_count: int = 3) -> list[dict]:
    """Every prompt of the space: `{prompt, color, shape, count, position}`."""
    out = []
    for color in COLORS:
        for shape in SHAPES:
            for count in range(1, max_count + 1):
                noun = shape if count == 1 else PLURAL[shape]
                word = ["a", "two", "three", "four"][count - 1]
                out.append({"prompt": f"{word} {color} {noun}", "color": color, "shape": shape,
                            "count": count, "position": None})
            for side in ("left", "right"):
                out.append({"prompt": f"a {color} {shape} on the {side}", "color": color, "shape": shape,
                            "count": 1, "position": side})
    return out


def t2i_records(split: str = "train", eval_fraction: float = 0.2, max_count: int = 3, repeats: int = 1) -> list[dict]:
    """Text-to-image prompts with their spec (the verifier reads it from `meta`). `repeats` lists the
    split `repeats` times over (an evaluation then draws each prompt with that many seeds)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    want_eval = split == "eval"
    records = [r | {"answer": None} for r in t2i_prompt_space(max_count)
               if _is_eval_prompt(r["prompt"], eval_fraction) == want_eval]
    return [dict(r) for _ in range(repeats) for r in records]


def render_prompt(spec: dict, seed: int, size: int = 32):
    """An image that satisfies a text-to-image prompt spec (pretraining targets)."""
    rng = random.Random(seed)
    side = max(4, size // 4)
    half = size // 2
    while True:
        boxes = place(rng, half if spec.get("position") else size, [side] * spec["count"], gap=2)
        if boxes is not None:
            break
    if spec.get("position") == "right":
        boxes = [(x1 + half, y1, x2 + half, y2) for x1, y1, x2, y2 in boxes]
    if spec.get("position"):
        dy = rng.randrange(0, size - half + 1)
        boxes = [(x1, min(y1 + dy, size - side - 1), x2, min(y1 + dy, size - side - 1) + side)
                 for x1, y1, x2, y2 in boxes]
    shapes = tuple(Shape(spec["shape"], spec["color"], b) for b in boxes)
    return render(Scene(size, shapes))
