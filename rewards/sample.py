"""The one thing every reward scores: a `Sample` (a public contract: docs/guides/rewards.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One generated sample, as a reward sees it.

    prompt:  the text prompt the policy was given.
    output:  a `str` for a VLM completion, a `PIL.Image.Image` for a generated image.
    images:  the input images (`PIL.Image.Image`); empty for text-to-image.
    answer:  the reference answer (any type) or None.
    meta:    the other dataset columns, plus adapter records (e.g. `meta["resize"]`
             for VLM images: see `rewards.grounding`).
    id:      a stable identifier used in log messages ("step 3, prompt 1, sample 2").
    """

    prompt: str
    output: Any
    images: list = field(default_factory=list)
    answer: Any = None
    meta: dict = field(default_factory=dict)
    id: str = ""
