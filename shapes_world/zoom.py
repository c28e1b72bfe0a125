"""The zoom task of `configs/tiny/agent_zoom.yaml`: name the kind of the shape in one corner of a scene whose
shapes are too small to tell apart at the size the model is shown the picture ("thinking with images").

A scene is `size` x `size` pixels (224) with 2 to 4 shapes of different colours, each inside its own quadrant.
The question names a quadrant that holds one: "What shape is in the upper left corner?", and the answer is its
kind (circle, square or triangle). The kinds are drawn so that each is the answer equally often, so a constant
answer is right a third of the time. The policy shows images at 112 x 112 (`policy.max_pixels`), where a 24-32
pixel shape becomes 12-16 pixels, about half an image token; `zoom(region)` (tools/visual.py) with the
question's quadrant shows that quadrant at 112 x 112, where the shape has its full 24-32 pixels. (The question
names the quadrant, not a colour: an image token carries what is in its part of the picture, not where that part
is, so "where is the red one" is a lesson of its own for a model this small.)

One episode is one question: the reply `<answer> kind </answer>` ends it, with reward 1 when the kind is the
asked shape's (`info["success"]`), else 0. Tool calls in between do not move the environment.
"""

from __future__ import annotations

import random
from typing import Any

import gymnasium as gym
import numpy as np

from envs.actions import action_text_space, copy_observation, invalid_step, parse_action
from envs.render import FREE_TEXT, observation_space
from shapes_world.scene import COLORS, SHAPES, Scene, Shape, render

QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")   # tools/visual.py's region names
INSTRUCTIONS = "Name the kind of the shape in the asked corner: circle, square or triangle."
# the question's words for a quadrant: not the region names, which the zoom tool's description lists too, so the
# words point at one quadrant in the whole context
QUADRANT_WORDS = {"top-left": "upper left", "top-right": "upper right", "bottom-left": "lower left",
                  "bottom-right": "lower right"}


def question(quadrant: str) -> str:
    return f"What shape is in the {QUADRANT_WORDS[quadrant]} corner?"


def sample_zoom_scene(seed: int, size: int = 224, min_objects: int = 2, max_objects: int = 4,
                      sides: tuple[int, int] = (24, 32)) -> tuple[Scene, Shape, str]:
    """(scene, asked shape, its quadrant): the same seed always gives the same triple. The asked shape's kind
    is drawn uniformly (so the answers are balanced), the others' kinds independently; each shape lies inside
    its quadrant at least 4 pixels from the quadrant's edges."""
    rng = random.Random(seed)
    n = rng.randint(min_objects, max_objects)
    quadrants = rng.sample(range(4), n)
    colors = rng.sample(list(COLORS), n)
    half = size // 2
    shapes = []
    for q, color in zip(quadrants, colors):
        side = rng.randint(*sides)
        x0, y0 = (q % 2) * half, (q // 2) * half
        x, y = x0 + rng.randint(4, half - side - 4), y0 + rng.randint(4, half - side - 4)
        shapes.append(Shape(rng.choice(SHAPES), color, (x, y, x + side, y + side)))
    return Scene(size, tuple(shapes)), shapes[0], QUADRANTS[quadrants[0]]


class ZoomScenes(gym.Env):
    """One question about one shape of a shapes-world scene; the answer is its kind."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, size: int = 224, min_objects: int = 2, max_objects: int = 4, render_mode: str | None = "rgb_array"):
        if not 1 <= int(min_objects) <= int(max_objects) <= 4:
            raise ValueError(f"ZoomScenes: need 1 <= min_objects <= max_objects <= 4 (one shape per quadrant), "
                             f"not {min_objects} and {max_objects}")
        if int(size) < 96:
            raise ValueError(f"ZoomScenes: size must be at least 96 pixels (a quadrant holds a shape of up to 32 "
                             f"pixels with a margin), not {size}")
        self.size, self.min_objects, self.max_objects = int(size), int(min_objects), int(max_objects)
        self.render_mode = render_mode
        self.instructions = INSTRUCTIONS
        self.action_space = action_text_space()
        self.observation_space = observation_space(256, FREE_TEXT, (self.size, self.size))
        self.scene: Scene | None = None
        self.target: Shape | None = None
        self.quadrant: str | None = None
        self.answered: str | None = None
        self._obs: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        draw = int(self.np_random.integers(2**31)) if seed is None else int(seed)
        self.scene, self.target, self.quadrant = sample_zoom_scene(draw, self.size, self.min_objects, self.max_objects)
        self.answered = None
        self._obs = {"text": question(self.quadrant), "image": np.asarray(render(self.scene))}
        return copy_observation(self._obs), {"success": False}

    def step(self, action: str):
        if self.target is None or self._obs is None:
            raise RuntimeError("ZoomScenes: call reset(seed=...) first")
        if self.answered is not None:
            raise RuntimeError("ZoomScenes: the episode ended with the answer; call reset(seed=...)")
        index = parse_action(action, SHAPES)
        if index is None:
            return invalid_step(self._obs, False)
        self.answered = SHAPES[index]
        success = self.answered == self.target.kind
        self._obs = {"text": f"You said {self.answered}.", "image": self._obs["image"]}
        return copy_observation(self._obs), float(success), True, False, {"success": success, "action_is_valid": True}

    def render(self):
        return None if self._obs is None else self._obs["image"].copy()
