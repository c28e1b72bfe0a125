"""The zoom task (shapes_world/zoom.py): deterministic scenes with one shape per quadrant, balanced answers (a
constant answer scores a third), the reward of an answer, and the `zoom` tool showing the asked shape larger."""

from collections import Counter

import numpy as np
import pytest

from rewards.shapes.palette import COLORS
from shapes_world.scene import SHAPES
from shapes_world.zoom import QUADRANTS, ZoomScenes, question, sample_zoom_scene
from tools.visual import REGIONS, zoom


def _pixels_of(image, color: str) -> int:
    arr = np.asarray(image).reshape(-1, 3).astype(int)                       # [H * W, 3]
    return int((np.abs(arr - np.array(COLORS[color])).sum(1) < 60).sum())


def test_scenes_are_determined_by_seed_with_one_shape_per_quadrant_and_distinct_colours():
    assert sample_zoom_scene(5) == sample_zoom_scene(5) and sample_zoom_scene(5) != sample_zoom_scene(6)
    for seed in range(300):
        scene, target, quadrant = sample_zoom_scene(seed)
        assert scene.shapes[0] == target and 2 <= len(scene.shapes) <= 4
        assert len({s.color for s in scene.shapes}) == len(scene.shapes)
        quads = []
        for s in scene.shapes:
            x1, y1, x2, y2 = s.box
            assert 24 <= x2 - x1 <= 32
            qx, qy = x1 // 112, y1 // 112
            assert (x2 - 1) // 112 == qx and (y2 - 1) // 112 == qy            # inside one quadrant
            quads.append(QUADRANTS[2 * qy + qx])
        assert len(set(quads)) == len(quads) and quads[0] == quadrant


def test_the_asked_kinds_are_balanced_so_a_constant_answer_scores_a_third():
    kinds = Counter(sample_zoom_scene(1_000_000 + k)[1].kind for k in range(3000))   # held-out seeds
    assert set(kinds) == set(SHAPES)
    for kind in SHAPES:
        assert abs(kinds[kind] / 3000 - 1 / 3) < 0.03, kinds


@pytest.mark.parametrize("reply, reward, success", [("right kind", 1.0, True), ("wrong kind", 0.0, False)])
def test_an_answer_ends_the_episode_with_its_reward(reply, reward, success):
    env = ZoomScenes()
    obs, info = env.reset(seed=11)
    target = env.target
    assert obs["text"] == question(env.quadrant) and obs["image"].shape == (224, 224, 3) and not info["success"]
    kind = target.kind if reply == "right kind" else next(k for k in SHAPES if k != target.kind)
    obs, r, terminated, truncated, info = env.step(f" {kind.capitalize()}. ")
    assert (r, terminated, truncated, info["success"]) == (reward, True, False, success)
    with pytest.raises(RuntimeError, match="ended"):
        env.step(kind)


def test_an_unparsed_answer_is_invalid_and_changes_nothing():
    env = ZoomScenes()
    env.reset(seed=3)
    obs, r, terminated, _, info = env.step("a hexagon")
    assert (r, terminated, info["action_is_valid"]) == (0.0, False, False)
    assert env.step(env.target.kind)[1] == 1.0


@pytest.mark.parametrize("kwargs", [{"min_objects": 0}, {"max_objects": 5}, {"min_objects": 3, "max_objects": 2},
                                    {"size": 64}])
def test_bad_arguments_are_refused_with_what_was_expected(kwargs):
    with pytest.raises(ValueError, match="ZoomScenes: "):
        ZoomScenes(**kwargs)


def test_zoom_shows_the_asked_shape_four_times_as_large_and_no_other():
    env = ZoomScenes()
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        target = env.target
        whole = _pixels_of(obs["image"], target.color)
        closer = zoom(env.quadrant, obs)
        assert closer.size == (224, 224)
        assert 3.0 * whole <= _pixels_of(closer, target.color) <= 4.5 * whole      # twice the side (edges blur)
        for other in env.scene.shapes[1:]:
            assert _pixels_of(closer, other.color) == 0
    assert set(QUADRANTS) <= set(REGIONS)
