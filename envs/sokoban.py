"""Sokoban rooms generated per reset seed by reverse play, as text and image (gym-sokoban / RAGEN).

Generation follows gym-sokoban (mpSchrader/gym-sokoban, used by RAGEN): a random walk carves the
floor inside a walled room, targets and the player are placed on it with every box on its
target, then the player plays in reverse, pulling boxes, and the state reached is the start.
Every move of reverse play undoes a legal forward move, so every room is solvable. All draws
come from `np.random.default_rng(seed)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from envs.actions import action_text_space, copy_observation, invalid_step, parse_action
from envs.render import Cell, check_render_mode, grid_image, grid_observation_space, grid_text, render_output

Pos = tuple[int, int]

ACTIONS = ("up", "down", "left", "right")
MOVES: dict[int, Pos] = {0: (-1, 0), 1: (1, 0), 2: (0, -1), 3: (0, 1)}

# gym-sokoban's rewards (sokoban_env.py): per step, box onto / off a target, all boxes placed
STEP_REWARD, ON_TARGET_REWARD, OFF_TARGET_REWARD, SOLVED_REWARD = -0.1, 1.0, -1.0, 10.0

# RAGEN's Sokoban symbols (ragen/env/sokoban/config.py)
SYMBOLS = "#_OX√PS"
WALL, FLOOR, TARGET, BOX, BOX_ON, PLAYER = (
    (112, 76, 58), (226, 220, 204), (214, 48, 48), (206, 140, 48), (66, 168, 78), (44, 88, 220))
PALETTE = {
    "#": Cell(WALL),
    "_": Cell(FLOOR),
    "O": Cell(FLOOR, (("ring", TARGET),)),
    "X": Cell(FLOOR, (("square", BOX),)),
    "√": Cell(FLOOR, (("ring", TARGET), ("square", BOX_ON))),
    "P": Cell(FLOOR, (("circle", PLAYER),)),
    "S": Cell(FLOOR, (("ring", TARGET), ("circle", PLAYER))),
}

# the shapes the floor-carving walk stamps around its position (gym-sokoban's masks)
MASKS = tuple(np.array([[ch == "1" for ch in row] for row in mask.split()]) for mask in (
    "000 111 000", "010 010 010", "000 110 010", "000 110 110", "000 011 010"))
TURN_PROBABILITY = 0.35


@dataclass
class Room:
    """A Sokoban state: fixed walls and targets, the boxes and the player."""

    walls: np.ndarray                 # bool, True = wall
    targets: frozenset[Pos]
    boxes: set[Pos] = field(default_factory=set)
    player: Pos = (0, 0)

    def symbols(self) -> list[list[str]]:
        """The grid of RAGEN symbols."""
        grid = [["#" if w else "_" for w in row] for row in self.walls]
        for r, c in self.targets:
            grid[r][c] = "O"
        for r, c in self.boxes:
            grid[r][c] = "√" if (r, c) in self.targets else "X"
        r, c = self.player
        grid[r][c] = "S" if self.player in self.targets else "P"
        return grid

    def free(self, pos: Pos) -> bool:
        """Whether `pos` is floor with no box on it."""
        return not self.walls[pos] and pos not in self.boxes

    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)


def _add(pos: Pos, move: Pos, k: int = 1) -> Pos:
    return pos[0] + k * move[0], pos[1] + k * move[1]


def carve_floor(size: int, rng: np.random.Generator) -> np.ndarray:
    """A bool floor mask inside a `size` x `size` room with walls all round, carved by a random walk."""
    floor = np.zeros((size, size), dtype=bool)
    pos = np.array([rng.integers(1, size - 1), rng.integers(1, size - 1)])
    move = np.array(MOVES[int(rng.integers(4))])
    for _ in range(int(1.7 * 2 * size)):  # gym-sokoban: 1.7 * (width + height) steps
        if rng.random() < TURN_PROBABILITY:
            move = np.array(MOVES[int(rng.integers(4))])
        mask = MASKS[int(rng.integers(len(MASKS)))]
        for dr, dc in np.argwhere(mask) - 1:
            r, c = pos[0] + dr, pos[1] + dc
            if 0 < r < size - 1 and 0 < c < size - 1:
                floor[r, c] = True
        pos = np.clip(pos + move, 1, size - 2)
    return floor


def place(floor: np.ndarray, num_boxes: int, rng: np.random.Generator) -> Room | None:
    """The solved room: player and targets on distinct floor cells, every box on its target (None if too small)."""
    cells = [tuple(int(v) for v in p) for p in np.argwhere(floor)]
    if len(cells) < num_boxes + 2:
        return None
    chosen = [cells[i] for i in rng.choice(len(cells), num_boxes + 1, replace=False)]
    targets = frozenset(chosen[1:])
    return Room(walls=~floor, targets=targets, boxes=set(targets), player=chosen[0])


def reverse_play(room: Room, steps: int, rng: np.random.Generator) -> Room:
    """Play `steps` random moves backwards: the player steps to a free cell and pulls a box from behind."""
    for _ in range(steps):
        move = MOVES[int(rng.integers(4))]
        ahead, behind = _add(room.player, move), _add(room.player, move, -1)
        if not room.free(ahead):
            continue
        if behind in room.boxes:
            room.boxes.remove(behind)
            room.boxes.add(room.player)
        room.player = ahead
    return room


def generate_room(size: int, num_boxes: int, search_depth: int, rng: np.random.Generator,
                  max_tries: int) -> Room:
    """A solvable room with at least one box off its target, or RuntimeError after `max_tries` rooms."""
    for _ in range(max_tries):
        room = place(carve_floor(size, rng), num_boxes, rng)
        if room is None:
            continue
        room = reverse_play(room, search_depth, rng)
        if room.boxes_on_target() < num_boxes:
            return room
    raise RuntimeError(f"Sokoban: no room of size {size} with {num_boxes} box(es) and at least one box moved "
                       f"after {max_tries} tries; use a larger size, fewer boxes or a larger search_depth")


def push(room: Room, move: Pos) -> None:
    """Move the player one cell, pushing a box ahead when the cell beyond it is free; else nothing moves."""
    ahead = _add(room.player, move)
    if room.walls[ahead]:
        return
    if ahead in room.boxes:
        beyond = _add(ahead, move)
        if not room.free(beyond):
            return
        room.boxes.remove(ahead)
        room.boxes.add(beyond)
    room.player = ahead


def instructions() -> str:
    """The task description shown once at the start."""
    return ("Sokoban: push every box onto a target. You are the player; moving into a box pushes it one cell "
            "if the cell beyond is free. You cannot pull boxes or push two at once, and walls block moves. "
            "Symbols: # wall, _ floor, O target, X box, √ box on a target, P player, S player on a target. "
            "In the image: brown walls, beige floor, red rings for targets, orange boxes (green on a target), "
            "the player a blue dot. Rewards: -0.1 per move, +1 for a box pushed onto a target, -1 for a box "
            "pushed off one, +10 when all boxes are on targets. "
            f"Actions: {', '.join(ACTIONS)}.")


class Sokoban(gym.Env):
    """Push boxes onto targets in a room generated from the reset seed (gym-sokoban / RAGEN Sokoban)."""

    metadata = {"render_modes": ["rgb_array", "ansi"]}

    def __init__(self, size: int = 6, num_boxes: int = 1, search_depth: int = 30, max_gen_tries: int = 100,
                 render_mode: str | None = "rgb_array"):
        if int(size) < 4:
            raise ValueError(f"Sokoban: size (the room side, outer wall included) must be at least 4, not {size}")
        if int(num_boxes) < 1 or int(search_depth) < 1 or int(max_gen_tries) < 1:
            raise ValueError(f"Sokoban: num_boxes, search_depth and max_gen_tries must be at least 1, not "
                             f"{num_boxes}, {search_depth}, {max_gen_tries}")
        self.size, self.num_boxes = int(size), int(num_boxes)
        self.search_depth, self.max_gen_tries = int(search_depth), int(max_gen_tries)
        self.render_mode = check_render_mode(render_mode, "Sokoban")
        self.instructions = instructions()
        self.action_space = action_text_space()
        self.observation_space = grid_observation_space(self.size, self.size, SYMBOLS)
        self.room: Room | None = None
        self._obs: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        room_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        rng = np.random.default_rng(room_seed)
        self.room = generate_room(self.size, self.num_boxes, self.search_depth, rng, self.max_gen_tries)
        self._obs = self._observe()
        return copy_observation(self._obs), {"success": False}

    def step(self, action: str):
        room = self._require_reset()
        index = parse_action(action, ACTIONS)
        if index is None:
            return invalid_step(self._obs, self.success)
        before = room.boxes_on_target()
        push(room, MOVES[index])
        after = room.boxes_on_target()
        reward = STEP_REWARD + ON_TARGET_REWARD * max(after - before, 0) + OFF_TARGET_REWARD * max(before - after, 0)
        if self.success:
            reward += SOLVED_REWARD
        self._obs = self._observe()
        info = {"success": self.success, "action_is_valid": True}
        return copy_observation(self._obs), float(reward), self.success, False, info

    def render(self):
        self._require_reset()
        return render_output(self.render_mode, self._obs)

    @property
    def success(self) -> bool:
        """Whether every box is on a target."""
        return self._require_reset().boxes_on_target() == self.num_boxes

    def _require_reset(self) -> Room:
        if self.room is None:
            raise RuntimeError("Sokoban: call reset(seed=...) before step() or render()")
        return self.room

    def _observe(self) -> dict[str, Any]:
        grid = self._require_reset().symbols()
        return {"text": grid_text(grid), "image": grid_image(grid, PALETTE)}
