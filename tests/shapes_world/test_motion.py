"""The shapes world's moving shapes (shapes_world/motion.py): the prompt space and its split, clips that satisfy
their prompts for every prompt and several seeds (checked by the motion verifier and by the boxes themselves),
determinism, and misuse."""

import numpy as np
import pytest

from rewards.sample import Video
from rewards.shapes.motion import DIRECTIONS, score_clip
from shapes_world.motion import clip_boxes, render_clip, t2v_prompt_space, t2v_records


def test_prompt_space_and_split():
    space = t2v_prompt_space()
    assert len(space) == 4 * 3 * 2 * 4 and len({r["prompt"] for r in space}) == len(space)
    assert {"a red circle moving right", "two blue squares moving up"} <= {r["prompt"] for r in space}
    train, held_out = t2v_records("train"), t2v_records("eval")
    assert len(train) + len(held_out) == len(space) and not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert {r["direction"] for r in held_out} == set(DIRECTIONS) and {r["count"] for r in held_out} == {1, 2}
    assert len(t2v_records("eval", repeats=3)) == 3 * len(held_out)


@pytest.mark.parametrize("seed", [0, 7])
def test_every_prompt_has_a_clip_that_satisfies_it(seed):
    """Every prompt's clip scores 1 on every check, and 0 on direction for each of the other three directions."""
    for spec in t2v_prompt_space():
        clip = render_clip(spec, seed)
        got = score_clip(clip, spec["color"], spec["shape"], spec["count"], spec["direction"])
        assert got["score"] == 1.0 and got["clutter"] == 0.0, (spec["prompt"], got)
        for other in set(DIRECTIONS) - {spec["direction"]}:
            assert score_clip(clip, spec["color"], spec["shape"], spec["count"], other)["direction"] == 0.0


def test_boxes_move_together_by_step_and_stay_inside():
    spec = {"color": "red", "shape": "square", "count": 2, "direction": "left"}
    boxes = clip_boxes(spec, seed=5, size=32, frames=9, step=2)
    assert len(boxes) == 9 and all(len(b) == 2 for b in boxes)
    for k in range(1, 9):
        for (a, b) in zip(boxes[k - 1], boxes[k]):
            assert (b[0] - a[0], b[1] - a[1], b[2] - a[2], b[3] - a[3]) == (-2, 0, -2, 0)
    assert all(0 <= x1 and x2 <= 32 and 0 <= y1 and y2 <= 32 for frame in boxes for x1, y1, x2, y2 in frame)


def test_clips_are_determined_by_their_seed():
    spec = t2v_prompt_space()[10]
    a, b, c = render_clip(spec, 3), render_clip(spec, 3), render_clip(spec, 4)
    assert isinstance(a, Video) and len(a) == 9 and a.size == (32, 32) and a.fps == 8.0
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.frames, b.frames))
    assert not all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a.frames, c.frames))


def test_misuse_is_refused():
    spec = {"color": "red", "shape": "square", "count": 1, "direction": "sideways"}
    with pytest.raises(ValueError, match="unknown direction 'sideways'"):
        render_clip(spec, 0)
    with pytest.raises(ValueError, match="do not fit"):
        render_clip({**spec, "direction": "up"}, 0, size=16, frames=9, step=2)
    with pytest.raises(ValueError, match="split must be"):
        t2v_records("test")
