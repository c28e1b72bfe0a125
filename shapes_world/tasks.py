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


def _unique(scene: Scene, key) -> list[Shape]:
    """The shapes no other shape of the scene shares `key(shape)` with."""
    return [s for s in scene.shapes if sum(key(t) == key(s) for t in scene.shapes) == 1]


def _count_question(rng: random.Random, scene: Scene, want: str | None) -> dict | None:
    counts = {c: sum(s.color == c for s in scene.shapes) for c in COLORS}
    colors = [c for c, n in counts.items() if want is None or str(n) == want]
    if not colors:
        return None
    color = rng.choice(colors)
    return {"task": "count", "prompt": f"How many {color} shapes are in the image?", "answer": str(counts[color])}


def _attribute_question(rng: random.Random, scene: Scene, want: str | None) -> dict | None:
    shapes = [s for s in _unique(scene, lambda s: s.kind) if want is None or s.color == want]
    if not shapes:
        return None
    s = rng.choice(shapes)
    return {"task": "attribute", "prompt": f"What colour is the {s.kind}?", "answer": s.color}


def _relation_question(rng: random.Random, scene: Scene, want: str | None) -> dict | None:
    unique = _unique(scene, lambda s: (s.kind, s.color))
    if len(unique) < 2:
        return None
    a, b = rng.sample(unique, 2)
    if abs(a.center[0] - b.center[0]) < 2:
        return None
    if want is not None and (want == "yes") != (a.center[0] < b.center[0]):
        a, b = b, a                                     # the same pair, asked the other way round
    answer = "yes" if a.center[0] < b.center[0] else "no"
    return {"task": "relation", "prompt": f"Is the {a.color} {a.kind} left of the {b.color} {b.kind}? Answer yes or no.",
            "answer": answer}


def _grounding_question(rng: random.Random, scene: Scene, want: None) -> dict | None:
    unique = _unique(scene, lambda s: (s.kind, s.color))
    if not unique:
        return None
    s = rng.choice(unique)
    return {"task": "grounding", "prompt": f"Give the bounding box [x1, y1, x2, y2] of the {s.color} {s.kind}.",
            "answer": list(s.box)}


QUESTIONS = {"count": _count_question, "attribute": _attribute_question,
             "relation": _relation_question, "grounding": _grounding_question}


def answer_space(task: str, max_objects: int) -> list[str] | None:
    """The answers a balanced draw cycles through for `task` (None: boxes, not drawn balanced)."""
    return {"count": [str(k) for k in range(max_objects + 1)], "attribute": list(COLORS),
            "relation": ["yes", "no"]}.get(task)


def _wanted(tasks: list[str], n: int, max_objects: int, rng: random.Random) -> list[str | None]:
    """The gold answer of each of the n records: the j-th record asks tasks[j % len(tasks)], and each
    task's answers come in shuffled blocks of its whole answer space, so every answer is equally
    frequent (exactly so when the task's record count is a multiple of the space's size)."""
    queues: dict[str, list] = {t: [] for t in tasks}
    out = []
    for j in range(n):
        task = tasks[j % len(tasks)]
        space = answer_space(task, max_objects)
        if space is None:
            out.append(None)
            continue
        if not queues[task]:
            queues[task] = rng.sample(space, len(space))
        out.append(queues[task].pop())
    return out


def vlm_records(n: int = 256, split: str = "train", tasks: list | None = None, size: int = 56,
                max_objects: int = 4, seed: int = 0, balanced: bool = True) -> list[dict]:
    """`n` records `{prompt, images: [PIL], answer, task, scene_seed}`, asking the tasks in turn.

    balanced: each task's gold answers are equally frequent (count 0..max_objects, the four colours,
    yes/no), so a constant answer scores at most 1/(its answer space) on a task: record j's answer is
    fixed first and scenes (in seed order) are skipped until one has a question with that answer,
    i.e. scenes are drawn from the scene distribution conditioned on the answer. False: the question
    is drawn from the next scene as it comes (counts then skew to 0 and 1)."""
    tasks = list(tasks or ["count", "attribute", "relation"])
    unknown = [t for t in tasks if t not in QUESTIONS]
    if unknown:
        raise ValueError(f"unknown shapes task(s) {unknown}; valid: {', '.join(QUESTIONS)}")
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    base = (EVAL_SEED_BASE if split == "eval" else 0) + seed * 100_003
    wanted = _wanted(tasks, n, max_objects, random.Random(base)) if balanced else [None] * n
    out, i = [], 0
    while len(out) < n:
        scene_seed = base + i
        i += 1
        rng = random.Random(scene_seed * 7 + 1)
        scene = sample_scene(scene_seed, size, max_objects)
        q = QUESTIONS[tasks[len(out) % len(tasks)]](rng, scene, wanted[len(out)])
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
