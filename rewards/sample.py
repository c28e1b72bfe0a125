"""The one thing every reward scores: a `Sample` (a public contract: docs/guides/rewards.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One generated sample, as a reward sees it.

    prompt:  the text prompt the policy was given.
    output:  a `str` for a VLM completion, a `PIL.Image.Image` for a generated image, a `Video` for a
             generated video.
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


@dataclass(frozen=True)
class Video:
    """A generated video: its frames in order (`PIL.Image.Image`, all one size) and the frame rate it is
    played and saved at."""

    frames: tuple
    fps: float = 16.0

    def __post_init__(self):
        if not self.frames:
            raise ValueError("a Video needs at least one frame")
        object.__setattr__(self, "frames", tuple(self.frames))

    def __len__(self) -> int:
        return len(self.frames)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of every frame, as `PIL.Image.Image.size`."""
        return self.frames[0].size


def frame_indices(n: int, frames: int) -> list[int]:
    """Indices of `frames` frames spread evenly over n (the first and the last included); all n for frames 0
    or frames >= n."""
    if frames <= 0 or frames >= n:
        return list(range(n))
    if frames == 1:
        return [0]
    return sorted({round(k * (n - 1) / (frames - 1)) for k in range(frames)})
