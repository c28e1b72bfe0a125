"""Action text -> action index: the one parser of every built-in environment and the gym adapter.

Also the two small pieces every environment shares around it: the action space it declares
(free text) and what a step with unparseable text returns.
"""

from __future__ import annotations

import string
from typing import Any, Sequence

from gymnasium import spaces

# stripped from both ends of the action text, with whitespace: "Left." / "**up**" / "`2`" parse
STRIP = string.whitespace + ".,!?:;\"'`*"

MAX_ACTION_CHARS = 256


def parse_action(text: str, names: Sequence[str]) -> int | None:
    """The index of `text` in `names`, or None when it names no action.

    Case-insensitive; whitespace and the punctuation .,!?:;"'`* around the text are ignored. The
    text must then equal one name exactly ("left", not "go left" or "left right"), or be the
    decimal index of one ("2").
    """
    if not isinstance(text, str):
        return None
    word = text.strip(STRIP).casefold()
    for i, name in enumerate(names):
        if word == name.casefold():
            return i
    if word.isascii() and word.isdigit() and int(word) < len(names):
        return int(word)
    return None


def action_text_space() -> spaces.Text:
    """The action space of a text environment: the model's action text."""
    return spaces.Text(max_length=MAX_ACTION_CHARS, min_length=0, charset=string.printable)


def copy_observation(obs: dict[str, Any]) -> dict[str, Any]:
    """A fresh observation dict (the image copied), so callers never share a mutable buffer."""
    return {k: (v.copy() if hasattr(v, "copy") else v) for k, v in obs.items()}


def invalid_step(obs: dict[str, Any], success: bool) -> tuple[dict[str, Any], float, bool, bool, dict]:
    """The step result for action text that names no action: nothing changes, reward 0.0.

    The caller of the environment substitutes its configured penalty for the 0.0.
    """
    return copy_observation(obs), 0.0, False, False, {"success": bool(success), "action_is_valid": False}
