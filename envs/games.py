"""Two small games of several roles (multi-role environments, see `envs` for the contract).

- `SignalGame` (`signal`), roles acting in turn: the speaker is shown a secret word (and a swatch of its colour)
  and writes a message; the listener reads the message and names the secret among `words`. Both share the
  team's reward: 1 when the listener names the secret, else 0. A listener that cannot read the message is right
  1 / len(words) of the time.
- `MatchingGame` (`matching`), roles acting at once: both players are shown the same `words` and each picks one;
  each is rewarded 1 when the two picks agree. The reward is per role (a dict), so `env.role_credit` decides
  whether a player is credited with its own reward or the team's.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium import spaces
from PIL import Image

from envs.actions import action_text_space, parse_action

COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 80, 220), "yellow": (230, 210, 40)}
MESSAGE_CHARS = 200          # what the listener is shown of a message


def _role_space(roles: tuple[str, ...]) -> spaces.Dict:
    return spaces.Dict({r: spaces.Dict({"text": spaces.Text(max_length=512)}) for r in roles})


def _check_words(words, game: str) -> tuple[str, ...]:
    words = tuple(str(w) for w in words)
    if len(words) < 2 or len(set(w.casefold() for w in words)) != len(words):
        raise ValueError(f"{game}: words must be at least two distinct words, not {list(words)}")
    return words


def _check_actions(actions: Any, acting: tuple[str, ...], game: str) -> dict:
    if not isinstance(actions, dict) or set(actions) != set(acting):
        got = sorted(actions) if isinstance(actions, dict) else type(actions).__name__
        raise ValueError(f"{game}: step takes one action per acting role {list(acting)}, got {got}")
    return actions


class SignalGame(gym.Env):
    """A referential game in words, two roles in turn: speaker, then listener (module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}
    roles = ("speaker", "listener")

    def __init__(self, words: tuple | list = ("red", "green", "blue"), image: bool = True):
        self.words = _check_words(words, "SignalGame")
        self.with_image = bool(image)
        self.instructions = {
            "speaker": "You see a secret word. Write a short message so that your partner can name it.",
            "listener": f"Your partner saw a secret word and wrote you a message. Name the secret word: "
                        f"{', '.join(self.words)}.",
        }
        self.action_space = action_text_space()
        self.observation_space = _role_space(self.roles)
        self.secret: int | None = None
        self.acting: tuple[str, ...] = ()

    def _swatch(self, word: str) -> Image.Image:
        return Image.new("RGB", (28, 28), COLOURS.get(word.casefold(), (128, 128, 128)))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(len(self.words)))
        self.acting = ("speaker",)
        obs = {"text": f"The secret word is {self.words[self.secret]}."}
        if self.with_image:
            obs["image"] = self._swatch(self.words[self.secret])
        return {"speaker": obs}, {"secret": self.words[self.secret]}

    def step(self, actions: dict):
        if self.secret is None or not self.acting:
            raise RuntimeError("SignalGame: call reset() before step() (and again after the episode ended)")
        actions = _check_actions(actions, self.acting, "SignalGame")
        if self.acting == ("speaker",):
            message = " ".join(str(actions["speaker"] or "").split())[:MESSAGE_CHARS] or "(nothing)"
            self.acting = ("listener",)
            obs = {"listener": {"text": f"Your partner's message: {message}"}}
            return obs, 0.0, False, False, {"success": False, "action_is_valid": {"speaker": True}}
        pick = parse_action(actions["listener"], self.words)
        success = pick == self.secret
        self.acting = ()
        return {}, float(success), True, False, {"success": success,
                                                 "action_is_valid": {"listener": pick is not None}}


class MatchingGame(gym.Env):
    """Two players pick a word at once; each gets 1 when the picks agree (module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}
    roles = ("first", "second")

    def __init__(self, words: tuple | list = ("left", "right"), rounds: int = 1):
        self.words = _check_words(words, "MatchingGame")
        if int(rounds) < 1:
            raise ValueError(f"MatchingGame: rounds must be >= 1, not {rounds}")
        self.rounds = int(rounds)
        self.instructions = (f"You and your partner each pick one word at the same time: {', '.join(self.words)}. "
                             "You both win when you pick the same word.")
        self.action_space = action_text_space()
        self.observation_space = _role_space(self.roles)
        self.played = -1
        self.last: dict = {}

    def _obs(self) -> dict:
        text = (f"Round {self.played + 1} of {self.rounds}."
                + (f" Last round: {self.last['first']} and {self.last['second']}." if self.last else ""))
        return {r: {"text": text} for r in self.roles}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.played, self.last = 0, {}
        return self._obs(), {}

    def step(self, actions: dict):
        if self.played < 0 or self.played >= self.rounds:
            raise RuntimeError("MatchingGame: call reset() before step() (and again after the episode ended)")
        actions = _check_actions(actions, self.roles, "MatchingGame")
        picks = {r: parse_action(actions[r], self.words) for r in self.roles}
        agree = picks["first"] is not None and picks["first"] == picks["second"]
        self.last = {r: self.words[p] if p is not None else "nothing" for r, p in picks.items()}
        self.played += 1
        done = self.played >= self.rounds
        rewards = {r: float(agree) for r in self.roles}
        return ({} if done else self._obs()), rewards, done, False, {
            "success": agree, "action_is_valid": {r: p is not None for r, p in picks.items()}}
