"""The shapes world's motion verifier (rewards/shapes/motion.py) on clips drawn by hand: the displacement by least
squares, the direction rule, each check, the clutter factor, and the reward functions' None cases."""

import pytest
from PIL import Image, ImageDraw

import rewards
from rewards.sample import Sample, Video
from rewards.shapes.motion import displacement, moves, score_clip
from rewards.shapes.palette import COLORS


def _clip(positions, color="red", side=8, size=32, background=(255, 255, 255), kind="square"):
    """A clip whose k-th frame shows one shape per (x, y) of positions[k] (top-left corners)."""
    frames = []
    for boxes in positions:
        im = Image.new("RGB", (size, size), background)
        draw = ImageDraw.Draw(im)
        for x, y in boxes:
            if kind == "square":
                draw.rectangle((x, y, x + side - 1, y + side - 1), fill=COLORS[color])
            else:
                draw.ellipse((x, y, x + side - 1, y + side - 1), fill=COLORS[color])
        frames.append(im)
    return Video(frames=frames, fps=8)


def test_displacement_is_the_least_squares_velocity_times_the_length():
    # x = 0, 1, 2, 3 (slope 1) with the frame 2 missing: still slope 1 over 4 frames -> 3 px
    assert displacement([(0.0, 5.0), (1.0, 5.0), None, (3.0, 5.0)]) == pytest.approx((3.0, 0.0))
    # noisy x = 0, 2, 1, 4 (mean 1.75): slope = sum((t - 1.5)(x - 1.75)) / sum((t - 1.5)^2)
    #   = (2.625 - 0.125 - 0.375 + 3.375) / 5 = 1.1 -> 3.3 px
    assert displacement([(0.0, 0.0), (2.0, 0.0), (1.0, 0.0), (4.0, 0.0)]) == pytest.approx((3.3, 0.0))
    assert displacement([None, (1.0, 1.0), None]) is None and displacement([None, None]) is None


@pytest.mark.parametrize("delta,direction,want", [
    ((6.0, 0.0), "right", True), ((4.0, 0.0), "right", False),      # 4.8 px needed at side 32
    ((6.0, 2.9), "right", True), ((6.0, 3.1), "right", False),      # along must exceed twice the drift
    ((-6.0, 0.0), "right", False), ((-6.0, 0.0), "left", True),
    ((0.0, -6.0), "up", True), ((0.0, 6.0), "down", True), ((0.0, 6.0), "up", False), (None, "up", False)])
def test_direction_rule(delta, direction, want):
    assert moves(delta, direction, side=32) is want


def test_a_square_moving_right_scores_every_check():
    clip = _clip([[(2 + 2 * k, 10)] for k in range(9)])
    got = score_clip(clip, "red", "square", 1, "right")
    assert got == {"present": 1.0, "count": 1.0, "shape": 1.0, "direction": 1.0, "clutter": 0.0, "score": 1.0}
    assert score_clip(clip, "red", "square", 1, "left")["score"] == pytest.approx(0.75)


def test_a_still_clip_gets_no_direction_and_a_wrong_one_loses_its_checks():
    still = _clip([[(10, 10)]] * 9)
    assert score_clip(still, "red", "square", 1, "right") == {"present": 1.0, "count": 1.0, "shape": 1.0,
                                                              "direction": 0.0, "clutter": 0.0, "score": 0.75}
    # the shape shows in 6 of 9 frames and moves right in them: present 6/9, count 6/9, direction 1
    frames = [[(2 + 2 * k, 4)] for k in range(9)]
    frames[2] = frames[5] = frames[8] = []
    got = score_clip(_clip(frames), "red", "square", 1, "right")
    assert (got["present"], got["count"], got["direction"]) == (pytest.approx(6 / 9), pytest.approx(6 / 9), 1.0)
    # two of those frames show a second square: count 4/9
    frames[0] = [(2, 4), (2, 20)]
    frames[1] = [(4, 4), (4, 20)]
    assert score_clip(_clip(frames), "red", "square", 1, "right")["count"] == pytest.approx(4 / 9)
    circles = score_clip(_clip([[(2 + 2 * k, 10)] for k in range(9)], kind="circle"), "red", "square", 1, "right")
    assert circles["shape"] == 0.0 and circles["direction"] == 1.0


def test_clutter_scales_the_score_down():
    grey = _clip([[(2 + 2 * k, 10)] for k in range(9)], background=(200, 200, 200))   # every background pixel stray
    got = score_clip(grey, "red", "square", 1, "right")
    assert got["clutter"] > 0.9 and got["score"] == 0.0 and got["direction"] == 1.0


def test_the_reward_functions_read_the_spec_and_skip_what_they_cannot_judge():
    clip = _clip([[(2, 2 + 2 * k)] for k in range(9)])                # moving down
    meta = {"color": "red", "shape": "square", "count": 1, "direction": "down"}
    samples = [Sample("a red square moving down", clip, meta=meta), Sample("p", clip.frames[0], meta=meta),
               Sample("p", clip, meta={"color": "red"}), Sample("a red square moving up", clip,
                                                                 meta={**meta, "direction": "up"})]
    assert rewards.resolve("shapes_motion")(samples) == [1.0, None, None, 0.75]
    assert rewards.resolve("shapes_motion_direction")(samples) == [1.0, None, None, 0.0]
    with pytest.raises(ValueError, match="unknown direction 'around'"):
        score_clip(clip, "red", "square", 1, "around")


@pytest.mark.parametrize("first", ["rewards.shapes.verify", "rewards.shapes.motion", "rewards.builtin"])
def test_the_shapes_verifiers_import_in_any_order(first):
    """rewards.builtin registers the shapes verifiers and the motion verifier reads the image verifier: importing
    either first in a fresh process (as pretrain_t2i's held-out score does) must not meet a half-made module."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", f"import {first}; import rewards; rewards.resolve('shapes_motion')"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-1500:]
