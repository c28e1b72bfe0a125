"""Tools for the tool-calling tests, loaded as `tests/vlm/agent_tools.py:<fn>` (a user's tools from a file
reference, as a config names them)."""

from __future__ import annotations

import time

import numpy as np


def lookup(key: str) -> str:
    """Look a word up in a tiny dictionary.

    Args:
        key: The word to look up.
    """
    return {"left": "go towards cell 0", "right": "go towards the last cell"}.get(key, f"no entry for {key!r}")


def sleepy(seconds: float) -> str:
    """Wait, then say so.

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)
    return f"slept {seconds:g} s"


def broken(n: int) -> str:
    """Always fails.

    Args:
        n: Any number.
    """
    raise RuntimeError(f"broken on {n}")


def picture(color: str, *, size: int = 28):
    """A square of one color, and its name.

    Args:
        color: red, green or blue.
    """
    rgb = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}[color]
    return [f"a {color} square", np.full((size, size, 3), rgb, dtype=np.uint8)]
