"""GymAdapter: installed gymnasium envs behind the text-and-image contract."""

import gymnasium as gym
import pytest
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
from gymnasium.error import DependencyNotInstalled

from envs import make_env
from envs.gym_adapter import GymAdapter, action_names

WIN_DEFAULT_MAP = ["down", "down", "right", "right", "down", "right"]  # SFFF / FHFH / FFFH / HFFG


def test_frozenlake_v1_runs_as_registered():
    env = make_env("gym:FrozenLake-v1")
    obs, info = env.reset(seed=0)
    assert obs["text"] == "P___\n_O_O\n___O\nO__G" and not info["success"]
    assert (obs["image"].mode, obs["image"].size) == ("RGB", (256, 256))
    assert "Actions: left, down, right, up." in env.instructions and "FrozenLake-v1" in env.instructions
    for action in ("Right", "down", "left"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_is_valid"] and isinstance(reward, float)
        if terminated:
            break
    assert sum(ch in "PX√" for ch in obs["text"]) == 1


def test_the_known_winning_path_succeeds_on_the_non_slippery_map():
    env = make_env("gym:FrozenLake-v1", {"is_slippery": False})
    env.reset(seed=0)
    for i, action in enumerate(WIN_DEFAULT_MAP):
        obs, reward, terminated, _, info = env.step(action)
        last = i == len(WIN_DEFAULT_MAP) - 1
        assert (reward, terminated, info["success"]) == ((1.0, True, True) if last else (0.0, False, False))
    assert obs["text"].endswith("√")


def test_known_ids_get_action_names_and_a_generic_text():
    taxi = make_env("gym:Taxi-v4")
    obs, _ = taxi.reset(seed=0)
    assert taxi.action_names == ("south", "north", "east", "west", "pickup", "dropoff")
    assert obs["text"].startswith("Observation: ") and obs["image"].mode == "RGB"
    assert taxi.step("north")[4]["action_is_valid"]
    assert make_env("gym:CliffWalking-v1").action_names == ("up", "right", "down", "left")


def test_generic_success_is_a_terminal_positive_reward():
    env = make_env("gym:Blackjack-v1")
    assert env.action_names == ("stick", "hit")
    outcomes = set()
    for seed in range(12):
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step("stick")
        assert terminated and info["success"] == (reward > 0)
        outcomes.add(info["success"])
    assert outcomes == {True, False}


def test_unknown_envs_are_stepped_by_index():
    env = GymAdapter(FrozenLakeEnv(render_mode="rgb_array", is_slippery=False))   # no spec: no names
    assert env.action_names == action_names(env.env) == ("0", "1", "2", "3") and env.env_id == "FrozenLakeEnv"
    env.reset(seed=0)
    assert env.step("1")[0]["text"].split("\n")[1][0] == "P"                         # 1 = down


def test_non_discrete_action_spaces_are_refused():
    with pytest.raises(ValueError, match=r"config key 'env.name'.*Pendulum-v1.*only Discrete action spaces"):
        make_env("gym:Pendulum-v1")


def test_missing_pygame_is_a_value_error_that_says_what_to_install(monkeypatch):
    env = make_env("gym:FrozenLake-v1")

    def no_pygame():
        raise DependencyNotInstalled("pygame is not installed")

    monkeypatch.setattr(env.env, "render", no_pygame)
    with pytest.raises(ValueError, match=r'pip install "gymnasium\[toy-text\]"'):
        env.reset(seed=0)


def test_the_time_limit_of_the_registration_still_truncates():
    env = make_env("gym:FrozenLake-v1", {"max_episode_steps": 2, "is_slippery": False})
    env.reset(seed=0)
    assert not env.step("right")[3] and env.step("left")[3]
    assert isinstance(env, gym.Wrapper)


def test_frozenlake_instructions_give_the_symbols_and_say_when_the_ice_is_slippery():
    slippery, firm = make_env("gym:FrozenLake-v1").instructions, make_env("gym:FrozenLake-v1", {"is_slippery": False})
    assert "X player fallen in a hole" in slippery and "slippery" in slippery
    assert "slippery" not in firm.instructions
