"""The shapes world's motion verifier for text-to-video: does the clip show the asked shapes moving the asked way?

Each frame is read as the text-to-image verifier reads an image (rewards/shapes/verify.py): the blobs of the asked
colour, their count and kind, and the clutter around them. Over the clip:

    present    the fraction of frames that show the asked colour;
    count      the fraction of frames with the asked number of blobs;
    shape      the fraction of the blobs (over all frames) of the asked kind;
    direction  1 when the asked colour's centre of mass moves the asked way: its least-squares velocity over the
               frames that show it, times the clip's length, is at least `min_move` (a fraction of the frame
               side) along the asked axis and more than twice its drift across it; else 0.

`shapes_motion` (the reward) is the mean of the four, times the cleanliness of the clutter averaged over the
frames (1 up to 4% of a frame, 0 from 16%), so a clip that paints the background loses what it gains.
`shapes_motion_direction` is the direction check alone: the motion accuracy a run reports. Neither looks at
anything but the asked colour's blobs and the clutter; a still clip scores 0 on direction whatever it shows.
"""

from __future__ import annotations

import numpy as np

from rewards.registry import register
from rewards.sample import Video
from rewards.shapes.palette import COLORS
from rewards.shapes import verify   # the module, not its names: importing verify first imports this one

DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}   # image axes: y grows downward
MIN_MOVE = 0.15             # the displacement a clip needs along the asked axis, as a fraction of the frame side


def _frame(image, color: str):
    """(blobs of `color`, the centre of mass (x, y) of their pixels or None, the frame's clutter)."""
    arr, masks = verify._colour_masks(image, 90.0)
    blobs, covered = verify._blobs({color: masks[color]}, verify._min_area(arr, 0.004))
    ys, xs = np.nonzero(covered)
    centre = (float(xs.mean()), float(ys.mean())) if xs.size else None
    return blobs, centre, verify._clutter(arr, covered)


def displacement(centres: list) -> tuple[float, float] | None:
    """The least-squares velocity of the centres (None where a frame shows nothing) times the clip's length in
    frames minus one: (dx, dy) in pixels; None when fewer than two frames show the colour."""
    seen = [(k, c) for k, c in enumerate(centres) if c is not None]
    if len(seen) < 2:
        return None
    t = np.array([k for k, _ in seen], dtype=np.float64)                       # [K] frame numbers
    xy = np.array([c for _, c in seen], dtype=np.float64)                      # [K, 2]
    tc = t - t.mean()
    velocity = (tc[:, None] * (xy - xy.mean(0))).sum(0) / (tc ** 2).sum()     # [2] px per frame
    return tuple(float(v) * (len(centres) - 1) for v in velocity)


def moves(delta: tuple[float, float] | None, direction: str, side: int, min_move: float = MIN_MOVE) -> bool:
    """Whether a displacement (dx, dy) is a move the asked way (module docstring)."""
    if delta is None:
        return False
    ax, ay = DIRECTIONS[direction]
    along, across = delta[0] * ax + delta[1] * ay, abs(delta[0] * ay) + abs(delta[1] * ax)
    return along >= min_move * side and along > 2 * across


def score_clip(video: Video, color: str, shape: str, count: int, direction: str,
               min_move: float = MIN_MOVE) -> dict[str, float]:
    """The checks of one clip against one prompt spec: present, count, shape, direction, clutter, score."""
    if color not in COLORS:
        raise ValueError(f"unknown colour {color!r}; valid: {', '.join(COLORS)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; valid: {', '.join(DIRECTIONS)}")
    frames = [_frame(f, color) for f in video.frames]
    blobs = [b for bs, _, _ in frames for b in bs]
    checks = {"present": float(np.mean([bool(bs) for bs, _, _ in frames])),
              "count": float(np.mean([len(bs) == count for bs, _, _ in frames])),
              "shape": sum(b.kind == shape for b in blobs) / len(blobs) if blobs else 0.0,
              "direction": float(moves(displacement([c for _, c, _ in frames]), direction,
                                       min(video.size), min_move))}
    clutter = float(np.mean([c for _, _, c in frames]))
    score = sum(checks.values()) / len(checks)
    return {**checks, "clutter": clutter, "score": score * verify.cleanliness(clutter) if score else 0.0}


def _spec(s) -> dict | None:
    m = s.meta or {}
    if not isinstance(s.output, Video) or "color" not in m or "direction" not in m:
        return None
    return m


@register("shapes_motion")
def shapes_motion(samples: list, min_move: float = MIN_MOVE) -> list[float | None]:
    """Shapes-world clip check in [0, 1]: colour present, count, shape and direction of motion (meta holds the
    spec), times how clean the frames are."""
    return [None if (m := _spec(s)) is None else
            score_clip(s.output, m["color"], m.get("shape", ""), int(m.get("count", 1)), m["direction"],
                       min_move)["score"] for s in samples]


@register("shapes_motion_direction")
def shapes_motion_direction(samples: list, min_move: float = MIN_MOVE) -> list[float | None]:
    """1 when the asked colour moves the asked way in the clip, else 0 (the motion accuracy)."""
    return [None if (m := _spec(s)) is None else
            float(moves(displacement([_frame(f, m["color"])[1] for f in s.output.frames]), m["direction"],
                        min(s.output.size), min_move)) for s in samples]
