"""Bandit: RAGEN's two named arms, the order drawn from the seed, success by expected reward."""

import numpy as np
import pytest

from envs.bandit import Bandit, name_colour


def test_the_seed_draws_the_order_of_the_arms():
    env = Bandit()
    orders = {}
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        orders[seed] = env.arms
        assert obs["text"].index(f"Arm 0: {env.arms[0]}") < obs["text"].index(f"Arm 1: {env.arms[1]}")
    assert set(orders.values()) == {("phoenix", "dragon"), ("dragon", "phoenix")}
    again = Bandit()
    assert all(again.reset(seed=s) and again.arms == orders[s] for s in orders)


def test_the_image_shows_one_panel_per_arm_in_the_listed_order():
    env = Bandit()
    obs, _ = env.reset(seed=0)
    pixels = np.asarray(obs["image"])
    assert (obs["image"].mode, obs["image"].size) == ("RGB", (112, 56))
    assert tuple(pixels[28, 28]) == name_colour(env.arms[0]) and tuple(pixels[28, 84]) == name_colour(env.arms[1])
    assert name_colour("dragon") != name_colour("phoenix") and name_colour("Dragon") == name_colour("dragon")


def test_pulling_the_high_risk_arm_is_success_whatever_it_pays():
    env = Bandit()
    for seed in range(4):
        env.reset(seed=seed)
        obs, reward, terminated, truncated, info = env.step("Dragon")
        assert reward in (0.0, 1.0) and terminated and not truncated
        assert info == {"success": True, "action_is_valid": True} and "dragon" in obs["text"]
        env.reset(seed=seed)
        _, reward, terminated, _, info = env.step("phoenix")
        assert (reward, terminated, info["success"]) == (0.1, True, False)


def test_an_arm_can_be_pulled_by_its_listed_number():
    env = Bandit()
    env.reset(seed=5)
    env.step("1")
    assert env.pulled == env.arms[1]


def test_high_risk_payouts_are_seeded_and_about_a_quarter():
    def payout(seed):
        env = Bandit()
        env.reset(seed=seed)
        return env.step("dragon")[1]

    pays = [payout(s) for s in range(300)]
    assert pays[:20] == [payout(s) for s in range(20)]
    assert 0.15 < np.mean(pays) < 0.35


def test_success_follows_the_expected_rewards_set_by_kwargs():
    env = Bandit(low_risk_name="trader", high_risk_name="librarian", high_risk_prob=0.05)  # 0.05 < 0.1
    env.reset(seed=0)
    assert env.step("trader")[4]["success"]
    env.reset(seed=0)
    assert not env.step("librarian")[4]["success"]


def test_payoffs_are_described_on_request():
    obs, _ = Bandit(reveal_payoffs=True).reset(seed=0)
    assert "always pays 0.1" in obs["text"] and "pays 1 with probability 0.25, else 0" in obs["text"]
    assert "pays" not in Bandit().reset(seed=0)[0]["text"]
    assert "Actions: dragon, phoenix" in Bandit().instructions


def test_one_pull_ends_the_episode_and_bad_names_are_errors():
    env = Bandit()
    env.reset(seed=0)
    env.step("dragon")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("dragon")
    with pytest.raises(ValueError, match="different"):
        Bandit(low_risk_name="Dragon", high_risk_name="dragon")
