"""Any installed gymnasium environment with a Discrete action space, behind the text-and-image contract.

`GymAdapter(gymnasium.make(id, render_mode="rgb_array"))` reads action text (names for the known
toy-text ids, else the integers "0".."n-1"), returns `{"text", "image"}` observations (the image
is the env's own rgb_array render; the text is the FrozenLake grid in RAGEN's symbols, else
"Observation: <obs>") and adds `success` and `action_is_valid` to every step's info.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym
from gymnasium import spaces
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
from gymnasium.error import DependencyNotInstalled
from PIL import Image

from envs.actions import action_text_space, copy_observation, invalid_step, parse_action
from envs.frozenlake import ACTIONS as LAKE_ACTIONS
from envs.frozenlake import LEGEND, RULES, SLIPPERY, lake_grid, on_goal
from envs.render import FREE_TEXT, grid_text, observation_space

# action names in each env's own action order, by the registered name (the id without "-v<N>")
KNOWN_ACTIONS: dict[str, tuple[str, ...]] = {
    "FrozenLake": LAKE_ACTIONS,
    "FrozenLake8x8": LAKE_ACTIONS,
    "CliffWalking": ("up", "right", "down", "left"),
    "CliffWalkingSlippery": ("up", "right", "down", "left"),
    "Taxi": ("south", "north", "east", "west", "pickup", "dropoff"),
    "Blackjack": ("stick", "hit"),
}


def env_id(env: gym.Env) -> str:
    """The registered id of `env` (its class name when it was not made from the registry)."""
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


def action_names(env: gym.Env) -> tuple[str, ...]:
    """The names of a Discrete action space's actions: known names for the toy-text envs, else "0".."n-1"."""
    n = int(env.action_space.n)
    spec = env.spec
    known = KNOWN_ACTIONS.get(spec.name) if spec is not None and spec.namespace is None else None
    return known if known is not None and len(known) == n else tuple(str(i) for i in range(n))


class GymAdapter(gym.Wrapper):
    """A gymnasium env with a Discrete action space, stepped by action text, observed as text and image."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.env_id = env_id(env)
        if not isinstance(env.action_space, spaces.Discrete):
            raise ValueError(f"gymnasium environment {self.env_id!r} has action space {env.action_space}; "
                             f"only Discrete action spaces are supported (the model names one action per step)")
        self.action_names = action_names(env)
        self.action_space = action_text_space()
        self.observation_space = observation_space(4096, FREE_TEXT + "√", None)  # the image size varies by env
        self.instructions = (f"Environment: {self.env_id} (gymnasium).{self._legend()} "
                             f"Actions: {', '.join(self.action_names)}.")
        self._obs: dict[str, Any] | None = None
        self._success = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        raw, info = self.env.reset(seed=seed, options=options)
        self._obs = self._observe(raw)
        self._success = self._lake_success()
        return copy_observation(self._obs), {**info, "success": self._success}

    def step(self, action: str):
        index = parse_action(action, self.action_names)
        if index is None:
            if self._obs is None:
                raise RuntimeError(f"{self.env_id}: call reset(seed=...) before step()")
            return invalid_step(self._obs, self._success)
        raw, reward, terminated, truncated, info = self.env.step(int(self.env.action_space.start) + index)
        self._obs = self._observe(raw)
        self._success = self._succeeded(terminated, reward)
        info = {**info, "success": self._success, "action_is_valid": True}
        return copy_observation(self._obs), float(reward), bool(terminated), bool(truncated), info

    def _lake(self) -> FrozenLakeEnv | None:
        lake = self.env.unwrapped
        return lake if isinstance(lake, FrozenLakeEnv) else None

    def _lake_success(self) -> bool:
        lake = self._lake()
        return lake is not None and on_goal(lake.desc, lake.s)

    def _succeeded(self, terminated: bool, reward: SupportsFloat) -> bool:
        if self._lake() is not None:
            return self._lake_success()
        return bool(terminated) and float(reward) > 0

    def _legend(self) -> str:
        lake = self._lake()
        if lake is None:
            return ""
        slippery = any(len(moves) > 1 for state in lake.P.values() for moves in state.values())
        return f" {RULES} {LEGEND}" + (f" {SLIPPERY}" if slippery else "")

    def _text(self, raw: Any) -> str:
        lake = self._lake()
        return grid_text(lake_grid(lake.desc, lake.s)) if lake is not None else f"Observation: {raw}"

    def _image(self) -> Image.Image:
        try:
            frame = self.env.render()
        except DependencyNotInstalled as e:
            raise ValueError(f"rendering {self.env_id!r} needs pygame: "
                             f"pip install \"gymnasium[toy-text]\" ({e})") from e
        if frame is None:
            raise ValueError(f"{self.env_id!r} rendered nothing; it must be made with render_mode='rgb_array'")
        return Image.fromarray(frame).convert("RGB")

    def _observe(self, raw: Any) -> dict[str, Any]:
        return {"text": self._text(raw), "image": self._image()}
