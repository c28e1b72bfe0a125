"""Programmatic verifiers of the shapes world.

`shapes_t2i`: a GenEval-like check of a generated image done with pixel analysis: find
the connected blobs of the asked colour, classify each blob's shape by how much of its
bounding box it fills (square ~1, circle ~pi/4, triangle ~1/2), and score in [0, 1] the
mean of: the colour is present, the count is right, the blobs have the asked shape, and
(when asked) they lie on the asked side.
`shapes_vlm`: routes a VLM answer to the matching verifier by `meta["task"]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rewards.builtin.grounding import iou
from rewards.builtin.text import exact, numeric
from rewards.registry import register
from rewards.shapes.palette import BACKGROUND, COLORS


@dataclass(frozen=True)
class Blob:
    color: str
    area: int
    box: tuple[int, int, int, int]   # x1, y1, x2, y2 (exclusive)

    @property
    def fill(self) -> float:
        w, h = self.box[2] - self.box[0], self.box[3] - self.box[1]
        return self.area / max(w * h, 1)

    @property
    def kind(self) -> str:
        return "square" if self.fill > 0.88 else "circle" if self.fill > 0.64 else "triangle"

    @property
    def center_x(self) -> float:
        return (self.box[0] + self.box[2]) / 2


def _components(mask: np.ndarray) -> list[list[tuple[int, int]]]:
    """4-connected components of a boolean [H, W] mask (iterative flood fill)."""
    seen = np.zeros_like(mask, dtype=bool)
    comps = []
    h, w = mask.shape
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        stack, pixels = [(y0, x0)], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            pixels.append((y, x))
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < h and 0 <= nx < w and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        comps.append(pixels)
    return comps


def find_blobs(image, min_area_frac: float = 0.004, threshold: float = 90.0) -> list[Blob]:
    """Blobs of each palette colour: pixels nearer to that colour than `threshold` (RGB
    distance) and nearer to it than to any other palette colour or the background."""
    arr = np.asarray(image.convert("RGB"), dtype=np.float32)            # [H, W, 3]
    names = list(COLORS)
    palette = np.array([COLORS[c] for c in names] + [BACKGROUND], dtype=np.float32)     # [C+1, 3]
    dist = np.linalg.norm(arr[:, :, None, :] - palette[None, None], axis=-1)             # [H, W, C+1]
    nearest = dist.argmin(-1)                                           # [H, W]
    min_area = max(2, int(min_area_frac * arr.shape[0] * arr.shape[1]))
    blobs = []
    for ci, name in enumerate(names):
        mask = (nearest == ci) & (dist[:, :, ci] < threshold)
        for pixels in _components(mask):
            if len(pixels) < min_area:
                continue
            ys, xs = zip(*pixels)
            blobs.append(Blob(name, len(pixels), (min(xs), min(ys), max(xs) + 1, max(ys) + 1)))
    return blobs


def score_image(image, color: str, shape: str, count: int, position: str | None = None) -> float:
    """The shapes_t2i score of one image against one prompt spec, in [0, 1]."""
    if color not in COLORS:
        raise ValueError(f"unknown colour {color!r}; valid: {', '.join(COLORS)}")
    blobs = [b for b in find_blobs(image) if b.color == color]
    checks = [float(bool(blobs)), float(len(blobs) == count),
              sum(b.kind == shape for b in blobs) / len(blobs) if blobs else 0.0]
    if position is not None:
        half = image.size[0] / 2
        side_ok = [(b.center_x < half) if position == "left" else (b.center_x >= half) for b in blobs]
        checks.append(float(bool(blobs) and all(side_ok)))
    return sum(checks) / len(checks)


@register("shapes_t2i")
def shapes_t2i(samples: list) -> list[float | None]:
    """Shapes-world image check in [0, 1]: colour present, count, shape, position (meta holds the spec)."""
    out = []
    for s in samples:
        m = s.meta or {}
        if not hasattr(s.output, "convert") or "color" not in m:
            out.append(None)
            continue
        out.append(score_image(s.output, m["color"], m.get("shape", ""), int(m.get("count", 1)), m.get("position")))
    return out


ROUTES = {"count": numeric, "attribute": exact, "relation": exact, "grounding": iou}


@register("shapes_vlm")
def shapes_vlm(samples: list) -> list[float | None]:
    """Shapes-world VLM answer check: numeric (count), exact (attribute, relation), IoU (grounding)."""
    out: list[float | None] = [None] * len(samples)
    for task, fn in ROUTES.items():
        idx = [i for i, s in enumerate(samples) if (s.meta or {}).get("task") == task]
        if idx:
            for i, v in zip(idx, fn([samples[i] for i in idx])):
                out[i] = v
    return out
