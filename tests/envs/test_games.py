"""The multi-role games (envs/games.py): the seed decides the episode, the roles act as declared, the rewards and
validity flags follow the rules, and misuse is a clear error."""

from __future__ import annotations

import pytest

from envs import make_env


def test_signal_game_rounds():
    env = make_env("signal", {})
    assert env.roles == ("speaker", "listener")
    obs, info = env.reset(seed=3)
    assert list(obs) == ["speaker"] and info["secret"] in obs["speaker"]["text"]
    assert obs["speaker"]["image"].size == (28, 28)
    assert make_env("signal", {}).reset(seed=3)[0]["speaker"]["text"] == obs["speaker"]["text"]
    obs, reward, term, trunc, info = env.step({"speaker": "  it is\nthe   colour of grass "})
    assert list(obs) == ["listener"] and obs["listener"]["text"] == "Your partner's message: it is the colour of grass"
    assert (reward, term, trunc, info["success"]) == (0.0, False, False, False)
    obs, reward, term, trunc, info = env.step({"listener": info_secret(env)})
    assert (obs, reward, term, info["success"], info["action_is_valid"]) == ({}, 1.0, True, True, {"listener": True})


def info_secret(env) -> str:
    return env.words[env.secret]


def test_signal_game_wrong_and_invalid_answers():
    env = make_env("signal", {"words": ["red", "blue"], "image": False})
    obs, _ = env.reset(seed=0)
    assert "image" not in obs["speaker"]
    env.step({"speaker": None})                          # a reply without an action: the listener reads "(nothing)"
    wrong = "blue" if info_secret(env) == "red" else "red"
    _, reward, term, _, info = env.step({"listener": wrong})
    assert (reward, term, info["success"], info["action_is_valid"]) == (0.0, True, False, {"listener": True})
    env.reset(seed=0)
    env.step({"speaker": "x"})
    _, reward, _, _, info = env.step({"listener": "purple"})
    assert reward == 0.0 and info["action_is_valid"] == {"listener": False}


def test_signal_game_secrets_are_balanced():
    env = make_env("signal", {})
    counts = {}
    for seed in range(300):
        env.reset(seed=seed)
        counts[info_secret(env)] = counts.get(info_secret(env), 0) + 1
    assert set(counts) == {"red", "green", "blue"} and min(counts.values()) > 70


def test_matching_game_acts_at_once_with_per_role_rewards():
    env = make_env("matching", {"rounds": 2})
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"first", "second"}
    obs, reward, term, _, info = env.step({"first": "left", "second": "Right."})
    assert reward == {"first": 0.0, "second": 0.0} and not term and not info["success"]
    assert "Last round: left and right" in obs["first"]["text"]
    obs, reward, term, _, info = env.step({"first": "1", "second": "right"})
    assert reward == {"first": 1.0, "second": 1.0} and term and info["success"] and obs == {}


@pytest.mark.parametrize("make, actions, match", [
    (lambda: make_env("signal", {}), {"listener": "red"}, "one action per acting role"),
    (lambda: make_env("matching", {}), {"first": "left"}, "one action per acting role"),
])
def test_games_reject_actions_of_roles_not_asked(make, actions, match):
    env = make()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=match):
        env.step(actions)


def test_games_check_their_arguments():
    with pytest.raises(ValueError, match="distinct"):
        make_env("signal", {"words": ["red", "Red"]})
    with pytest.raises(ValueError, match="rounds"):
        make_env("matching", {"rounds": 0})
    env = make_env("signal", {})
    with pytest.raises(RuntimeError, match="reset"):
        env.step({"speaker": "x"})
