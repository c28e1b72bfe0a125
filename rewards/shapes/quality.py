"""An image-quality measure of the shapes world that is not a reward: the stray-background fraction.

A clean shapes-world image holds only background and palette colours. `stray_fraction` counts the
pixels that are neither near the background (within BACKGROUND_RADIUS) nor near any palette colour
(within `threshold`) nor next to such a colour pixel (the soft edge of a shape): a tinted or textured
background, noise, colours the world does not have. It looks at every colour alike and knows nothing
of the prompt, so a run logs it next to its reward (`eval.diagnostics: [{name: shapes_stray}]`, logged
as `eval/quality/shapes_stray`): a reward that rises while it rises is being hacked. Lower is better;
the images the shapes world draws score 0.
"""

from __future__ import annotations

import numpy as np

from rewards.registry import register
from rewards.shapes.palette import COLORS
from rewards.shapes.pixels import background_mask, grow


def stray_fraction(image, threshold: float = 90.0) -> float:
    """The fraction of an image's pixels that are stray (see the module docstring), in [0, 1]."""
    arr = np.asarray(image.convert("RGB"), dtype=np.float32)                                   # [H, W, 3]
    palette = np.array(list(COLORS.values()), dtype=np.float32)                                # [C, 3]
    coloured = np.linalg.norm(arr[:, :, None] - palette[None, None], axis=-1).min(-1) < threshold        # [H, W]
    return float((~background_mask(arr) & ~grow(coloured)).mean())


@register("shapes_stray")
def shapes_stray(samples: list, threshold: float = 90.0) -> list[float | None]:
    """Stray-background fraction of an image in [0, 1] (lower is better; a diagnostic, not a reward)."""
    return [stray_fraction(s.output, threshold) if hasattr(s.output, "convert") else None for s in samples]
