"""Prompt sources for text-to-image recipes (`data.train: diffusion.prompts:<function>`)."""

from __future__ import annotations

import os

from mmrl.config import ConfigError

# The 45 animals of ddpo-pytorch's `simple_animals` prompt set (DDPO, arXiv 2305.13301).
ANIMALS = ["cat", "dog", "horse", "monkey", "rabbit", "zebra", "spider", "bird", "sheep", "deer", "cow", "goat",
           "lion", "tiger", "bear", "raccoon", "fox", "wolf", "lizard", "beetle", "ant", "butterfly", "fish",
           "shark", "whale", "dolphin", "squirrel", "mouse", "rat", "snake", "turtle", "frog", "chicken", "duck",
           "goose", "bee", "pig", "turkey", "fly", "llama", "camel", "bat", "gorilla", "hedgehog", "kangaroo"]


def lines(path: str) -> list[dict]:
    """One record {"prompt": line} per non-empty line of a text file (Flow-GRPO's and DanceGRPO's
    prompt lists, e.g. flow_grpo's dataset/pickscore/train.txt, are in this form)."""
    if not os.path.isfile(path):
        raise ConfigError(f"prompt file {path!r} does not exist "
                          "(config key data.train_kwargs.path or data.eval_kwargs.path)")
    with open(path, encoding="utf-8") as f:
        return [{"prompt": line.strip()} for line in f if line.strip()]


def animals() -> list[dict]:
    """DDPO's simple-animals prompts: the animal name alone, as ddpo-pytorch's `simple_animals`."""
    return [{"prompt": a} for a in ANIMALS]
