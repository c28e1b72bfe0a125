"""FrozenLake with a new random map per reset seed, as text and image (RAGEN's FrozenLake).

The dynamics, slipping included, are gymnasium's `FrozenLakeEnv`; this class draws the map from
the seed, reads the action text, and renders the lake in RAGEN's symbols and as a 28-px-per-cell
image.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from envs.actions import action_text_space, copy_observation, invalid_step, parse_action
from envs.render import Cell, check_render_mode, grid_image, grid_observation_space, grid_text, render_output

ACTIONS = ("left", "down", "right", "up")  # gymnasium's action order

# RAGEN's FrozenLake symbols (ragen/env/frozen_lake/config.py)
TILES = {"S": "_", "F": "_", "H": "O", "G": "G"}
PLAYER_ON = {"H": "X", "G": "√"}
SYMBOLS = "P_OGX√"

ICE, HOLE, GOAL, PLAYER = (200, 228, 246), (28, 48, 98), (72, 170, 84), (222, 52, 52)
PALETTE = {
    "_": Cell(ICE),
    "O": Cell(HOLE),
    "G": Cell(GOAL),
    "P": Cell(ICE, (("circle", PLAYER),)),
    "X": Cell(HOLE, (("cross", PLAYER),)),
    "√": Cell(GOAL, (("circle", PLAYER),)),
}


def lake_grid(desc: np.ndarray, state: int) -> list[list[str]]:
    """The grid of symbols of gymnasium's map `desc` (bytes S/F/H/G) with the player at flat index `state`."""
    letters = [[bytes(ch).decode() for ch in row] for row in desc]
    grid = [[TILES[ch] for ch in row] for row in letters]
    r, c = divmod(int(state), desc.shape[1])
    grid[r][c] = PLAYER_ON.get(letters[r][c], "P")
    return grid


def on_goal(desc: np.ndarray, state: int) -> bool:
    """Whether flat index `state` of map `desc` is the goal."""
    r, c = divmod(int(state), desc.shape[1])
    return bytes(desc[r, c]) == b"G"


RULES = "Move the player P across the frozen lake to the goal G without falling into a hole O."
LEGEND = "Symbols: P player, _ frozen ice, O hole, G goal, X player fallen in a hole, √ player on the goal."
SLIPPERY = "The ice is slippery: a move may go in a direction perpendicular to the one chosen."


def instructions(slippery: bool) -> str:
    """The task description shown once at the start."""
    return (f"FrozenLake. {RULES} {LEGEND} In the image: light blue ice, dark blue holes, the green goal, "
            "the player a red dot (a red cross when fallen in a hole)."
            f"{' ' + SLIPPERY if slippery else ''} Reaching the goal gives reward 1; falling into a hole ends "
            f"the episode. Actions: {', '.join(ACTIONS)}.")


class FrozenLake(gym.Env):
    """Reach the goal across a frozen lake; the reset seed draws the map (RAGEN's FrozenLake)."""

    metadata = {"render_modes": ["rgb_array", "ansi"]}

    def __init__(self, size: int = 4, p_frozen: float = 0.8, slippery: bool = False,
                 render_mode: str | None = "rgb_array"):
        if int(size) < 2:
            raise ValueError(f"FrozenLake: size must be at least 2, not {size}")
        if not 0.0 < float(p_frozen) <= 1.0:
            raise ValueError(f"FrozenLake: p_frozen (the probability a tile is frozen) must be in (0, 1], "
                             f"not {p_frozen}")
        self.size, self.p_frozen, self.slippery = int(size), float(p_frozen), bool(slippery)
        self.render_mode = check_render_mode(render_mode, "FrozenLake")
        self.instructions = instructions(self.slippery)
        self.action_space = action_text_space()
        self.observation_space = grid_observation_space(self.size, self.size, SYMBOLS)
        self._lake: FrozenLakeEnv | None = None
        self._obs: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        # the map gets its own seed drawn from the episode's generator: seeded by the reset seed, yet
        # independent of the slips drawn next (the same seed for both would tie slips to the layout)
        map_seed = int(self.np_random.integers(2**31))
        desc = generate_random_map(size=self.size, p=self.p_frozen, seed=map_seed)
        self._lake = FrozenLakeEnv(desc=desc, is_slippery=self.slippery)
        self._lake.np_random = self.np_random  # slipping draws from this env's seeded generator
        self._lake.reset()
        self._obs = self._observe()
        return copy_observation(self._obs), {"success": False}

    def step(self, action: str):
        lake = self._require_reset()
        index = parse_action(action, ACTIONS)
        if index is None:
            return invalid_step(self._obs, self.success)
        _, reward, terminated, _, _ = lake.step(index)
        self._obs = self._observe()
        info = {"success": self.success, "action_is_valid": True}
        return copy_observation(self._obs), float(reward), bool(terminated), False, info

    def render(self):
        self._require_reset()
        return render_output(self.render_mode, self._obs)

    @property
    def desc(self) -> np.ndarray:
        """The current map as gymnasium's bytes array (S start, F frozen, H hole, G goal)."""
        return self._require_reset().desc

    @property
    def player(self) -> tuple[int, int]:
        """The player's (row, column)."""
        return divmod(int(self._require_reset().s), self.size)

    @property
    def success(self) -> bool:
        """Whether the player stands on the goal."""
        lake = self._require_reset()
        return on_goal(lake.desc, lake.s)

    def _require_reset(self) -> FrozenLakeEnv:
        if self._lake is None:
            raise RuntimeError("FrozenLake: call reset(seed=...) before step() or render()")
        return self._lake

    def _observe(self) -> dict[str, Any]:
        lake = self._require_reset()
        grid = lake_grid(lake.desc, lake.s)
        return {"text": grid_text(grid), "image": grid_image(grid, PALETTE)}
