"""A tiny deterministic environment for the multi-turn tests, loaded as `tests/vlm/agent_env.py:Corridor`
(a user environment from a file reference, as a config names one).

The agent walks a corridor of `length` cells. Any non-empty action text is valid (its length's
parity picks the direction, so random replies move it) unless `strict` is set, when only "left"
and "right" are. Reward +1 on reaching the right end (terminated, success), else `step_reward`.
`truncate_after`: the environment truncates after that many valid steps. Observations: the cell
index as text and an image with the agent's cell lit.
"""

from __future__ import annotations

import gymnasium
import numpy as np
from PIL import Image


class Corridor(gymnasium.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, length: int = 4, strict: bool = False, step_reward: float = 0.0,
                 truncate_after: int | None = None, image: bool = True):
        self.length, self.strict, self.step_reward = length, strict, step_reward
        self.truncate_after, self.with_image = truncate_after, image
        self.action_space = gymnasium.spaces.Text(max_length=64)
        self.observation_space = gymnasium.spaces.Dict({"text": gymnasium.spaces.Text(max_length=256)})
        self.instructions = f"Walk right to the end of a corridor of {length} cells. Actions: left, right."

    def _obs(self) -> dict:
        obs = {"text": f"You are in cell {self.pos} of {self.length}."}
        if self.with_image:
            pixels = np.zeros((28, 28 * self.length, 3), dtype=np.uint8)
            pixels[:, 28 * self.pos:28 * (self.pos + 1)] = (255, 200, 0)
            obs["image"] = Image.fromarray(pixels)
        return obs

    def reset(self, seed: int | None = None, options=None):
        super().reset(seed=seed)
        self.pos = int(self.np_random.integers(0, self.length - 1))
        self.steps = 0
        return self._obs(), {"success": False}

    def step(self, action: str):
        word = action.strip().lower()
        if self.strict and word not in ("left", "right"):
            return self._obs(), 0.0, False, False, {"success": False, "action_is_valid": False}
        right = word == "right" if self.strict else len(word) % 2 == 0
        self.pos = min(self.length - 1, self.pos + 1) if right else max(0, self.pos - 1)
        self.steps += 1
        done = self.pos == self.length - 1
        truncated = self.truncate_after is not None and self.steps >= self.truncate_after and not done
        reward = 1.0 if done else self.step_reward
        return self._obs(), reward, done, truncated, {"success": done, "action_is_valid": True}
