"""The referential game of `configs/tiny/referential_game.yaml` (a Lewis signalling game in the shapes world), two
roles in turn.

A round draws K candidate pictures (K = 4 by default), each one shape of its own colour on a panel of PANEL x
PANEL pixels, and one of them as the target. The speaker is shown the target alone and writes a message; the
listener is shown the message and the K candidates side by side, numbered 1 to K from left to right, and answers
`<answer> n </answer>`. The team's reward is 1 when n is the target's number, else 0 (`info["success"]`); a
listener that cannot use the message is right 1 / K of the time. The candidates' colours differ, so a message that
names the target's colour identifies it; the kinds are drawn independently.

The panels are shaded from white (1) to dark grey (K), so each candidate's image tokens also say which panel it is:
an image token of a model this small carries what is in its part of the picture, not where that part is, and
naming the n-th panel is otherwise a lesson of its own.
"""

from __future__ import annotations

import random

import gymnasium as gym
from gymnasium import spaces
from PIL import Image, ImageDraw

from envs.actions import action_text_space, parse_action
from shapes_world.scene import BACKGROUND, COLORS, SHAPES, Shape, draw_shape

PANEL = 56                       # pixels per candidate panel
SHADES = (255, 205, 155, 105, 55, 5)   # panel n's grey, left to right
MESSAGE_CHARS = 120
INSTRUCTIONS = {
    "speaker": "You see the target picture. Write a short message so that your partner can find it among others.",
    "listener": "Your partner saw one of these pictures and wrote you a message. Which picture is it?",
}


def sample_round(seed: int, k: int = 4) -> tuple[list[Shape], int]:
    """(the K candidates, each a shape in its panel's coordinates; the target's index): the same seed, the same
    round. Colours are distinct, kinds independent, sides 24-36 pixels, at least 6 pixels from the panel's edge."""
    rng = random.Random(seed)
    colours = rng.sample(list(COLORS), k)
    shapes = []
    for colour in colours:
        side = rng.randint(24, 36)
        x, y = rng.randint(6, PANEL - side - 6), rng.randint(6, PANEL - side - 6)
        shapes.append(Shape(rng.choice(SHAPES), colour, (x, y, x + side, y + side)))
    return shapes, rng.randrange(k)


def panel(shape: Shape, shade: int | None = None) -> Image.Image:
    """One candidate on its panel (white when `shade` is None: the speaker's view)."""
    image = Image.new("RGB", (PANEL, PANEL), BACKGROUND if shade is None else (shade,) * 3)
    draw_shape(ImageDraw.Draw(image), shape)
    return image


def candidates_image(shapes: list[Shape], only: int | None = None) -> Image.Image:
    """The K panels side by side, panel n shaded SHADES[n - 1]; `only`: draw that candidate's shape alone (the
    other panels empty)."""
    image = Image.new("RGB", (PANEL * len(shapes), PANEL))
    for i, shape in enumerate(shapes):
        if only is None or i == only:
            image.paste(panel(shape, SHADES[i]), (PANEL * i, 0))
        else:
            image.paste(Image.new("RGB", (PANEL, PANEL), (SHADES[i],) * 3), (PANEL * i, 0))
    return image


def listener_text(message: str, k: int) -> str:
    return f"Your partner's message: {message}\nThe pictures are numbered 1 to {k} from left to right."


class ReferentialGame(gym.Env):
    """A speaker describes the target; a listener picks it among K candidates (module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}
    roles = ("speaker", "listener")

    def __init__(self, candidates: int = 4, distractors: bool = True):
        if not 2 <= int(candidates) <= min(len(COLORS), len(SHADES)):
            raise ValueError(f"ReferentialGame: candidates must be in [2, {min(len(COLORS), len(SHADES))}] (one "
                             f"colour each), not {candidates}")
        self.k = int(candidates)
        self.distractors = bool(distractors)      # False: the other panels are empty (a pretraining curriculum)
        self.names = [str(n) for n in range(1, self.k + 1)]
        self.instructions = dict(INSTRUCTIONS)
        self.action_space = action_text_space()
        self.observation_space = spaces.Dict({r: spaces.Dict({"text": spaces.Text(max_length=512)})
                                              for r in self.roles})
        self.shapes: list[Shape] = []
        self.target: int | None = None
        self.acting: tuple[str, ...] = ()
        self.message = ""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.shapes, self.target = sample_round(int(self.np_random.integers(2**31)) if seed is None else seed, self.k)
        self.acting, self.message = ("speaker",), ""
        t = self.shapes[self.target]
        return ({"speaker": {"text": "The target:", "image": panel(t)}},
                {"target": self.target + 1, "colour": t.color, "kind": t.kind})

    def step(self, actions: dict):
        if self.target is None or not self.acting:
            raise RuntimeError("ReferentialGame: call reset() before step() (and again after the episode ended)")
        if not isinstance(actions, dict) or set(actions) != set(self.acting):
            raise ValueError(f"ReferentialGame: step takes one action per acting role {list(self.acting)}, got "
                             f"{sorted(actions) if isinstance(actions, dict) else type(actions).__name__}")
        if self.acting == ("speaker",):
            self.message = " ".join(str(actions["speaker"] or "").split())[:MESSAGE_CHARS] or "(nothing)"
            self.acting = ("listener",)
            image = candidates_image(self.shapes, None if self.distractors else self.target)
            obs = {"listener": {"text": listener_text(self.message, self.k), "image": image}}
            return obs, 0.0, False, False, {"success": False, "action_is_valid": {"speaker": True}}
        pick = parse_action(actions["listener"], self.names)
        success = pick == self.target
        self.acting = ()
        return {}, float(success), True, False, {"success": success, "target": self.target + 1,
                                                 "action_is_valid": {"listener": pick is not None}}

    def render(self):
        import numpy as np

        return np.asarray(candidates_image(self.shapes)) if self.shapes else None
