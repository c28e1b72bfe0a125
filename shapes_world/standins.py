"""Stand-ins for real VLM datasets, drawn in the shapes world (CPU tests, configs/tiny/vlm_tiny.yaml):
small record lists shaped like a dataset export, deterministic from a seed.

    counting   "How many squares are in the image?" over k coloured squares (CLEVR-count style);
               answer: str(k)
    grounding  "Give the bounding box of the red square." (RefCOCO style); answer: [x1, y1, x2, y2]
               in the original image's pixels
Unlike the shapes-world tasks (shapes_world/tasks.py: square PIL scenes), these are canvases of any
width x height stored as PNG bytes (like Parquet exports), so they exercise the VLM adapter's lazy
decoding, resizing and resize records as real data does. Colours and background come from the one
palette (rewards/shapes/palette.py). Use as `data.train: shapes_world.standins:counting`.
"""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw

from shapes_world.scene import BACKGROUND, COLORS, Shape, draw_shape


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _squares(rng: random.Random, k: int, width: int, height: int, side: int) -> list[tuple]:
    """k non-overlapping squares (x1, y1, x2, y2; x2, y2 exclusive) on a width x height canvas."""
    boxes: list[tuple] = []
    while len(boxes) < k:
        x, y = rng.randrange(0, width - side), rng.randrange(0, height - side)
        box = (x, y, x + side, y + side)
        if all(box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1] for b in boxes):
            boxes.append(box)
    return boxes


def _canvas(width: int, height: int, squares: list[tuple[str, tuple]]) -> bytes:
    """PNG bytes of (colour, box) squares drawn with the shapes world's renderer."""
    img = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for color, box in squares:
        draw_shape(draw, Shape("square", color, box))
    return _png(img)


def counting(n: int = 16, seed: int = 0, width: int = 64, height: int = 48, max_count: int = 3) -> list[dict]:
    """n counting records with 1..max_count squares each."""
    rng, rows = random.Random(seed), []
    for i in range(n):
        k = rng.randint(1, max_count)
        boxes = _squares(rng, k, width, height, side=max(4, min(width, height) // 5))
        png = _canvas(width, height, [(rng.choice(list(COLORS)), box) for box in boxes])
        rows.append({"prompt": "How many squares are in the image? Answer with a number.",
                     "images": [png], "answer": str(k), "id": f"count-{seed}-{i}"})
    return rows


def grounding(n: int = 8, seed: int = 0, width: int = 80, height: int = 60) -> list[dict]:
    """n grounding records: the red square's box among one or two distractors of other colours."""
    rng, rows = random.Random(seed), []
    others = [c for c in COLORS if c != "red"]
    for i in range(n):
        boxes = _squares(rng, rng.randint(2, 3), width, height, side=max(6, min(width, height) // 4))
        png = _canvas(width, height, [("red", boxes[0])] + [(rng.choice(others), box) for box in boxes[1:]])
        rows.append({"prompt": "Give the bounding box [x1, y1, x2, y2] of the red square.",
                     "images": [png], "answer": list(boxes[0]), "id": f"ground-{seed}-{i}"})
    return rows
