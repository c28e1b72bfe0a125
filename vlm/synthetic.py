"""Small generated image datasets (CPU tests and the tiny config): deterministic from a seed.

    counting   "How many shapes are in the image?" over k coloured squares (CLEVR-count style);
               answer: str(k)
    grounding  "Give the bounding box of the red square." (RefCOCO style); answer: [x1, y1, x2, y2]
               in the original image's pixels
Images are PNG bytes in the records (like Parquet exports), so they go through the same lazy
decoding, resizing and resize records as real data. Use as `data.train: vlm.synthetic:counting`.
"""

from __future__ import annotations

import io
import random

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 200, 20)}


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _squares(rng: random.Random, k: int, width: int, height: int, side: int) -> list[tuple]:
    """k non-overlapping squares (x1, y1, x2, y2) on a width x height canvas."""
    boxes: list[tuple] = []
    while len(boxes) < k:
        x, y = rng.randrange(0, width - side), rng.randrange(0, height - side)
        box = (x, y, x + side, y + side)
        if all(box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1] for b in boxes):
            boxes.append(box)
    return boxes


def counting(n: int = 16, seed: int = 0, width: int = 64, height: int = 48, max_count: int = 3) -> list[dict]:
    """n counting records with 1..max_count squares each."""
    rng, rows = random.Random(seed), []
    for i in range(n):
        k = rng.randint(1, max_count)
        img = Image.new("RGB", (width, height), (245, 245, 245))
        draw = ImageDraw.Draw(img)
        for box in _squares(rng, k, width, height, side=max(4, min(width, height) // 5)):
            draw.rectangle(box, fill=rng.choice(list(COLOURS.values())))
        rows.append({"prompt": "How many squares are in the image? Answer with a number.",
                     "images": [_png(img)], "answer": str(k), "id": f"count-{seed}-{i}"})
    return rows


def grounding(n: int = 8, seed: int = 0, width: int = 80, height: int = 60) -> list[dict]:
    """n grounding records: the red square's box among one or two distractors."""
    rng, rows = random.Random(seed), []
    for i in range(n):
        img = Image.new("RGB", (width, height), (245, 245, 245))
        draw = ImageDraw.Draw(img)
        boxes = _squares(rng, rng.randint(2, 3), width, height, side=max(6, min(width, height) // 4))
        draw.rectangle(boxes[0], fill=COLOURS["red"])
        for box in boxes[1:]:
            draw.rectangle(box, fill=COLOURS[rng.choice(["green", "blue", "yellow"])])
        rows.append({"prompt": "Give the bounding box [x1, y1, x2, y2] of the red square.",
                     "images": [_png(img)], "answer": list(boxes[0]), "id": f"ground-{seed}-{i}"})
    return rows
