"""Moving shapes: text-to-video prompts of the shapes world and clips that satisfy them.

A prompt names a count (one or two), a colour, a shape and a direction: "a red circle moving right", "two blue
squares moving up". `render_clip` draws a clip that satisfies it: the shapes keep their size and colour and move
`step` pixels per frame the named way, all together, never leaving the canvas. Prompts are split into train and
eval by a hash of the prompt (as the text-to-image prompts are: no eval prompt is trained on), and a clip is fully
determined by its seed. The verifier that checks a clip against its prompt is rewards/shapes/motion.py.
"""

from __future__ import annotations

import random

from rewards.sample import Video
from rewards.shapes.motion import DIRECTIONS
from shapes_world.scene import COLORS, SHAPES, Scene, Shape, place, render
from shapes_world.tasks import PLURAL, _is_eval_prompt

COUNT_WORDS = {1: "a", 2: "two"}


def t2v_prompt_space() -> list[dict]:
    """Every prompt: `{prompt, color, shape, count, direction}` (4 colours x 3 shapes x 2 counts x 4 directions)."""
    out = []
    for color in COLORS:
        for shape in SHAPES:
            for count, word in COUNT_WORDS.items():
                noun = shape if count == 1 else PLURAL[shape]
                for direction in DIRECTIONS:
                    out.append({"prompt": f"{word} {color} {noun} moving {direction}", "color": color,
                                "shape": shape, "count": count, "direction": direction})
    return out


def t2v_records(split: str = "train", eval_fraction: float = 0.2, repeats: int = 1) -> list[dict]:
    """Text-to-video prompts with their spec (the verifier reads it from `meta`); `repeats` lists the split that
    many times over (an evaluation then draws each prompt with that many seeds)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    records = [r | {"answer": None} for r in t2v_prompt_space()
               if _is_eval_prompt(r["prompt"], eval_fraction) == (split == "eval")]
    return [dict(r) for _ in range(repeats) for r in records]


def clip_boxes(spec: dict, seed: int, size: int = 32, frames: int = 9, step: int = 2) -> list[list[tuple]]:
    """The shapes' boxes in every frame: [frame][shape] (x1, y1, x2, y2), moving `step` px per frame."""
    if spec["direction"] not in DIRECTIONS:
        raise ValueError(f"unknown direction {spec['direction']!r}; valid: {', '.join(DIRECTIONS)}")
    dx, dy = DIRECTIONS[spec["direction"]]
    side, travel = max(4, size // 4), step * (frames - 1)
    if side + travel + 2 > size:
        raise ValueError(f"{frames} frames of {step} px do not fit a {side} px shape in {size} px")
    rng = random.Random(seed)
    # place the shapes in the canvas shrunk by the travel along the motion's axis, then shift them so that the
    # whole path stays inside: moving right/down starts in the low part, left/up in the high part
    room = size - travel
    w, h = (room, size) if dx else (size, room)
    while True:
        boxes = place(rng, max(w, h), [side] * spec["count"], gap=2)
        if boxes is not None and all(b[2] < w and b[3] < h for b in boxes):
            break
    ox, oy = (travel if dx < 0 else 0), (travel if dy < 0 else 0)
    return [[(x1 + ox + dx * step * k, y1 + oy + dy * step * k, x2 + ox + dx * step * k, y2 + oy + dy * step * k)
             for x1, y1, x2, y2 in boxes] for k in range(frames)]


def render_clip(spec: dict, seed: int, size: int = 32, frames: int = 9, step: int = 2, fps: float = 8.0) -> Video:
    """A clip that satisfies a text-to-video prompt spec (pretraining targets, tests)."""
    return Video(frames=[render(Scene(size, tuple(Shape(spec["shape"], spec["color"], b) for b in boxes)))
                         for boxes in clip_boxes(spec, seed, size, frames, step)], fps=fps)
