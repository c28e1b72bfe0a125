"""The contract every environment keeps: seeded episodes, text+image observations, invalid actions."""

import numpy as np
import pytest

from envs import make_env

BUILDERS = {
    "bandit": ("bandit", {}),
    "frozenlake": ("frozenlake", {}),
    "sokoban": ("sokoban", {}),
    "gym:FrozenLake-v1": ("gym:FrozenLake-v1", {}),
}
VALID = {"bandit": "dragon", "frozenlake": "right", "sokoban": "up", "gym:FrozenLake-v1": "right"}


def build(key):
    name, kwargs = BUILDERS[key]
    return make_env(name, kwargs)


def same(a, b) -> bool:
    return a["text"] == b["text"] and a["image"].tobytes() == b["image"].tobytes()


@pytest.mark.parametrize("key", BUILDERS)
def test_invalid_action_text_changes_nothing(key):
    env = build(key)
    obs, _ = env.reset(seed=2)
    for text in ("jump", "", "left right", "   ", "99"):
        after, reward, terminated, truncated, info = env.step(text)
        assert info == {**info, "action_is_valid": False, "success": False}
        assert (reward, terminated, truncated) == (0.0, False, False) and same(after, obs)
    fresh = build(key)
    fresh.reset(seed=2)
    assert same(env.step(VALID[key])[0], fresh.step(VALID[key])[0])  # the state did not move


@pytest.mark.parametrize("key", BUILDERS)
def test_the_seed_decides_the_episode(key):
    a, b = build(key), build(key)
    for seed in (0, 11):
        assert same(a.reset(seed=seed)[0], b.reset(seed=seed)[0])
        step_a, step_b = a.step(VALID[key]), b.step(VALID[key])
        assert same(step_a[0], step_b[0]) and step_a[1:] == step_b[1:]


@pytest.mark.parametrize("key", BUILDERS)
def test_observations_spaces_and_render(key):
    env = build(key)
    obs, _ = env.reset(seed=0)
    assert isinstance(obs["text"], str) and obs["image"].mode == "RGB"
    assert env.action_space.contains(VALID[key]) and env.observation_space["text"].contains(obs["text"])
    if "image" in env.observation_space.spaces:
        assert env.observation_space["image"].contains(np.asarray(obs["image"]))
    assert "Actions:" in env.instructions and VALID[key] in env.instructions.lower()
    frame = env.render()
    assert frame.dtype == np.uint8 and np.array_equal(frame, np.asarray(obs["image"]))
    assert env.step(VALID[key])[4]["action_is_valid"] is True


@pytest.mark.parametrize("name", ["bandit", "frozenlake", "sokoban"])
def test_built_ins_render_text_and_refuse_to_step_before_reset(name):
    env = make_env(name, {"render_mode": "ansi"})
    assert env.metadata["render_modes"] == ["rgb_array", "ansi"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("up")
    obs, _ = env.reset(seed=0)
    assert env.render() == obs["text"]


def test_observations_are_fresh_objects():
    env = make_env("sokoban")
    obs, _ = env.reset(seed=0)
    obs["image"].paste((0, 0, 0), (0, 0, 168, 168))
    again = env.step("jump")[0]
    assert again["image"].tobytes() != obs["image"].tobytes()          # the caller's edit did not leak back
    assert again["image"] is not env.step("jump")[0]["image"]
