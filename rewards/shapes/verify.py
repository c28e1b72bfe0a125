"""Programmatic verifiers of the shapes world.

`shapes_t2i`: a GenEval-like check of a generated image done with pixel analysis: find
the connected blobs of the asked colour, classify each blob's shape by how much of its
bounding box it fills (square ~1, circle ~pi/4, triangle ~1/2), and score in [0, 1] the
mean of: the colour is present, the count is right, the blobs have the asked shape, and
(when asked) they lie on the asked side. That mean is then multiplied by how clean the rest
of the image is: every pixel that is neither background nor on (or next to) one of the asked
blobs is clutter (a textured or tinted background, speckle, stray shapes), and the factor falls
from 1 at `CLUTTER_FREE` of the image to 0 at `CLUTTER_ZERO`. A verifier that looked only at
the asked colour would be blind to the rest, and RL learns to paint the background (reward
hacking); `blind=True` keeps that old verifier for showing the guards against it.
`shapes_vlm`: routes a VLM answer to the matching verifier by `meta["task"]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rewards.builtin.grounding import iou
from rewards.builtin.text import exact, numeric
from rewards.registry import register
from rewards.shapes.palette import BACKGROUND, COLORS
from rewards.shapes.pixels import background_mask, grow

CLUTTER_FREE = 0.04        # clutter up to this fraction of the image costs nothing (soft edges)
CLUTTER_ZERO = 0.16        # ... and at this fraction the score is 0 (linear in between)


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


def _colour_masks(image, threshold: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The image as RGB [H, W, 3] and, per palette colour, its pixels: nearer to that colour than
    `threshold` (RGB distance) and nearer to it than to any other palette colour or the background."""
    arr = np.asarray(image.convert("RGB"), dtype=np.float32)            # [H, W, 3]
    names = list(COLORS)
    palette = np.array([COLORS[c] for c in names] + [BACKGROUND], dtype=np.float32)     # [C+1, 3]
    dist = np.linalg.norm(arr[:, :, None, :] - palette[None, None], axis=-1)             # [H, W, C+1]
    nearest = dist.argmin(-1)                                           # [H, W]
    return arr, {name: (nearest == ci) & (dist[:, :, ci] < threshold) for ci, name in enumerate(names)}


def _blobs(masks: dict[str, np.ndarray], min_area: int) -> tuple[list[Blob], np.ndarray]:
    """The blobs (components of at least `min_area` pixels) of each colour mask, and their pixels [H, W]."""
    blobs, covered = [], np.zeros_like(next(iter(masks.values())))
    for name, mask in masks.items():
        for pixels in _components(mask):
            if len(pixels) < min_area:
                continue
            ys, xs = zip(*pixels)
            covered[list(ys), list(xs)] = True
            blobs.append(Blob(name, len(pixels), (min(xs), min(ys), max(xs) + 1, max(ys) + 1)))
    return blobs, covered


def _min_area(arr: np.ndarray, min_area_frac: float) -> int:
    return max(2, int(min_area_frac * arr.shape[0] * arr.shape[1]))


def find_blobs(image, min_area_frac: float = 0.004, threshold: float = 90.0) -> list[Blob]:
    """Blobs of each palette colour: pixels nearer to that colour than `threshold` (RGB
    distance) and nearer to it than to any other palette colour or the background."""
    arr, masks = _colour_masks(image, threshold)
    return _blobs(masks, _min_area(arr, min_area_frac))[0]


def clutter_fraction(image, color: str, min_area_frac: float = 0.004, threshold: float = 90.0) -> float:
    """The fraction of pixels that are neither background (within BACKGROUND_RADIUS of it) nor on or
    next to a blob of `color`: tinted or textured background, speckle, shapes of other colours."""
    arr, masks = _colour_masks(image, threshold)
    return _clutter(arr, _blobs({color: masks[color]}, _min_area(arr, min_area_frac))[1])


def _clutter(arr: np.ndarray, asked: np.ndarray) -> float:
    """Clutter of an RGB image [H, W, 3] whose asked blobs cover `asked` [H, W]."""
    return float((~background_mask(arr) & ~grow(asked)).mean())


def cleanliness(clutter: float) -> float:
    """1 up to CLUTTER_FREE, 0 from CLUTTER_ZERO, linear in between."""
    return float(np.clip((CLUTTER_ZERO - clutter) / (CLUTTER_ZERO - CLUTTER_FREE), 0.0, 1.0))


def score_image(image, color: str, shape: str, count: int, position: str | None = None,
                blind: bool = False) -> float:
    """The shapes_t2i score of one image against one prompt spec, in [0, 1]: the mean of the checks
    times `cleanliness(clutter_fraction)`; `blind=True` leaves the factor out (the old verifier)."""
    if color not in COLORS:
        raise ValueError(f"unknown colour {color!r}; valid: {', '.join(COLORS)}")
    arr, masks = _colour_masks(image, 90.0)
    blobs, asked = _blobs({color: masks[color]}, _min_area(arr, 0.004))
    checks = [float(bool(blobs)), float(len(blobs) == count),
              sum(b.kind == shape for b in blobs) / len(blobs) if blobs else 0.0]
    if position is not None:
        half = image.size[0] / 2
        side_ok = [(b.center_x < half) if position == "left" else (b.center_x >= half) for b in blobs]
        checks.append(float(bool(blobs) and all(side_ok)))
    score = sum(checks) / len(checks)
    if blind or score == 0.0:
        return score
    return score * cleanliness(_clutter(arr, asked))


@register("shapes_t2i")
def shapes_t2i(samples: list, blind: bool = False) -> list[float | None]:
    """Shapes-world image check in [0, 1]: colour present, count, shape, position (meta holds the spec),
    times how clean the rest of the image is; `blind: true` judges only the asked colour's blobs."""
    out = []
    for s in samples:
        m = s.meta or {}
        if not hasattr(s.output, "convert") or "color" not in m:
            out.append(None)
            continue
        out.append(score_image(s.output, m["color"], m.get("shape", ""), int(m.get("count", 1)), m.get("position"),
                               blind=bool(blind)))
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
