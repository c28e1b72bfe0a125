"""Procedural scenes: a few circles, squares and triangles in the palette's colours
(rewards/shapes/palette.py) on its background, fully determined by a seed, rendered with Pillow."""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

from rewards.shapes.palette import BACKGROUND, COLORS, SHAPES  # the one palette, shared with the verifier

__all__ = ["BACKGROUND", "COLORS", "SHAPES", "Scene", "Shape", "draw_shape", "place", "render", "sample_scene"]


@dataclass(frozen=True)
class Shape:
    kind: str                      # circle | square | triangle
    color: str                     # a key of COLORS
    box: tuple[int, int, int, int]  # x1, y1, x2, y2 in pixels (x2, y2 exclusive)

    @property
    def center(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2


@dataclass(frozen=True)
class Scene:
    size: int
    shapes: tuple[Shape, ...]


def _overlaps(a, b, gap: int) -> bool:
    return not (a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1])


def place(rng: random.Random, size: int, sides: list[int], gap: int = 2, tries: int = 200):
    """Non-overlapping boxes of the given side lengths, or None if they do not fit."""
    boxes: list[tuple[int, int, int, int]] = []
    for side in sides:
        for _ in range(tries):
            x, y = rng.randrange(1, size - side), rng.randrange(1, size - side)
            box = (x, y, x + side, y + side)
            if all(not _overlaps(box, b, gap) for b in boxes):
                boxes.append(box)
                break
        else:
            return None
    return boxes


def sample_scene(seed: int, size: int = 56, max_objects: int = 4) -> Scene:
    """A scene of 1..max_objects shapes; the same seed always gives the same scene."""
    rng = random.Random(seed)
    while True:
        n = rng.randint(1, max_objects)
        sides = [rng.choice((size // 5, size // 4)) for _ in range(n)]
        boxes = place(rng, size, sides)
        if boxes is not None:
            break
    shapes = tuple(Shape(rng.choice(SHAPES), rng.choice(list(COLORS)), b) for b in boxes)
    return Scene(size, shapes)


def draw_shape(draw: ImageDraw.ImageDraw, shape: Shape) -> None:
    x1, y1, x2, y2 = shape.box
    fill = COLORS[shape.color]
    if shape.kind == "circle":
        draw.ellipse((x1, y1, x2 - 1, y2 - 1), fill=fill)
    elif shape.kind == "square":
        draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=fill)
    else:
        draw.polygon([((x1 + x2 - 1) / 2, y1), (x1, y2 - 1), (x2 - 1, y2 - 1)], fill=fill)


def render(scene: Scene) -> Image.Image:
    image = Image.new("RGB", (scene.size, scene.size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for shape in scene.shapes:
        draw_shape(draw, shape)
    return image
