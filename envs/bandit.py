"""Two-armed bandit with named arms: one pull, judged by the arm's expected reward (RAGEN's BiArmBandit).

Defaults follow RAGEN (ragen/env/bandit/config.py): a low-risk arm "phoenix" that always pays 0.1
and a high-risk arm "dragon" that pays 1.0 with probability 0.25, else 0.0 (expected 0.25), so the
name with the bolder connotation is the better pull. RAGEN's held-out pair is "trader" (low risk)
and "librarian" (high risk). The reset seed draws the order the arms are listed and numbered in,
so a policy must read the names, not a position.
"""

from __future__ import annotations

import colorsys
import hashlib
from typing import Any

import gymnasium as gym

from envs.actions import action_text_space, copy_observation, invalid_step, parse_action
from envs.render import CELL_PX, FREE_TEXT, RGB, check_render_mode, observation_space, panels_image, render_output

PANEL_PX = 2 * CELL_PX


def name_colour(name: str) -> RGB:
    """A saturated colour that depends only on the (case-folded) name, the same in every process."""
    hue = hashlib.sha256(name.casefold().encode()).digest()[0] / 256
    return tuple(int(255 * v) for v in colorsys.hsv_to_rgb(hue, 0.75, 0.9))  # type: ignore[return-value]


class Bandit(gym.Env):
    """Pull one of two named arms once; success when the arm of higher expected reward is pulled."""

    metadata = {"render_modes": ["rgb_array", "ansi"]}

    def __init__(self, low_risk_name: str = "phoenix", high_risk_name: str = "dragon",
                 low_risk_reward: float = 0.1, high_risk_reward: float = 1.0,
                 high_risk_miss_reward: float = 0.0, high_risk_prob: float = 0.25,
                 reveal_payoffs: bool = False, render_mode: str | None = "rgb_array"):
        names = (str(low_risk_name).strip(), str(high_risk_name).strip())
        if not all(names) or names[0].casefold() == names[1].casefold():
            raise ValueError(f"Bandit: low_risk_name and high_risk_name must be two different non-empty names, "
                             f"not {low_risk_name!r} and {high_risk_name!r}")
        if not 0.0 <= float(high_risk_prob) <= 1.0:
            raise ValueError(f"Bandit: high_risk_prob must be in [0, 1], not {high_risk_prob}")
        self.low_risk_name, self.high_risk_name = names
        self.low_risk_reward, self.high_risk_reward = float(low_risk_reward), float(high_risk_reward)
        self.high_risk_miss_reward, self.high_risk_prob = float(high_risk_miss_reward), float(high_risk_prob)
        self.reveal_payoffs = bool(reveal_payoffs)
        self.render_mode = check_render_mode(render_mode, "Bandit")
        self.instructions = self._instructions()
        self.action_space = action_text_space()
        self.observation_space = observation_space(1024, FREE_TEXT + "".join(names), (PANEL_PX, 2 * PANEL_PX))
        self.arms: tuple[str, str] | None = None   # the names in the order shown this episode
        self.pulled: str | None = None
        self._obs: dict[str, Any] | None = None

    def expected_reward(self, name: str) -> float:
        """The mean payoff of the arm called `name`."""
        if name == self.low_risk_name:
            return self.low_risk_reward
        p = self.high_risk_prob
        return p * self.high_risk_reward + (1 - p) * self.high_risk_miss_reward

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        low, high = self.low_risk_name, self.high_risk_name
        self.arms = (low, high) if self.np_random.random() < 0.5 else (high, low)  # RAGEN: _randomize_arms
        self.pulled = None
        self._obs = self._observe(self._describe())
        return copy_observation(self._obs), {"success": False}

    def step(self, action: str):
        arms = self._require_reset()
        if self.pulled is not None:
            raise RuntimeError("Bandit: the episode ended with the first pull; call reset(seed=...)")
        index = parse_action(action, arms)
        if index is None:
            return invalid_step(self._obs, False)
        self.pulled = arms[index]
        reward = self._payout(self.pulled)
        self._obs = self._observe(f"You pulled {self.pulled}: {reward:g} points.")
        info = {"success": self.success, "action_is_valid": True}
        return copy_observation(self._obs), reward, True, False, info

    def render(self):
        self._require_reset()
        return render_output(self.render_mode, self._obs)

    @property
    def success(self) -> bool:
        """Whether the pulled arm has the strictly higher expected reward (False before a pull)."""
        if self.pulled is None:
            return False
        other = self.high_risk_name if self.pulled == self.low_risk_name else self.low_risk_name
        return self.expected_reward(self.pulled) > self.expected_reward(other)

    def _payout(self, name: str) -> float:
        if name == self.low_risk_name:
            return self.low_risk_reward
        hit = self.np_random.random() < self.high_risk_prob
        return self.high_risk_reward if hit else self.high_risk_miss_reward

    def _payoff_text(self, name: str) -> str:
        if name == self.low_risk_name:
            return f"always pays {self.low_risk_reward:g}"
        return (f"pays {self.high_risk_reward:g} with probability {self.high_risk_prob:g}, "
                f"else {self.high_risk_miss_reward:g}")

    def _describe(self) -> str:
        arms = self._require_reset()
        lines = [f"Arm {i}: {name}" + (f", which {self._payoff_text(name)}." if self.reveal_payoffs else ".")
                 for i, name in enumerate(arms)]
        return "\n".join(["Two arms:", *lines, "Which arm do you pull?"])

    def _instructions(self) -> str:
        names = sorted((self.low_risk_name, self.high_risk_name), key=str.casefold)
        hint = ("Each arm's payoff is stated with it." if self.reveal_payoffs else
                "Each arm has its own reward distribution, related to its name: "
                "think about what the name suggests.")
        return ("Bandit: there are two arms; you pull one of them once and receive its reward. "
                f"{hint} Pull the arm you expect to pay more on average. "
                "The image shows one coloured panel per arm, in the order listed. "
                f"Actions: {', '.join(names)} (or the arm's number, 0 or 1).")

    def _require_reset(self) -> tuple[str, str]:
        if self.arms is None:
            raise RuntimeError("Bandit: call reset(seed=...) before step() or render()")
        return self.arms

    def _observe(self, text: str) -> dict[str, Any]:
        arms = self._require_reset()
        highlight = arms.index(self.pulled) if self.pulled is not None else None
        image = panels_image([name_colour(n) for n in arms], PANEL_PX, highlight)
        return {"text": text, "image": image}
