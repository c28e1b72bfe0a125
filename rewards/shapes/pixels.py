"""Pixel helpers the shapes-world checks share: what counts as background, and growing a mask."""

from __future__ import annotations

import numpy as np

from rewards.shapes.palette import BACKGROUND

BACKGROUND_RADIUS = 40.0   # RGB distance from BACKGROUND within which a pixel counts as background


def background_mask(arr: np.ndarray) -> np.ndarray:
    """[H, W] True where an RGB image [H, W, 3] (float) is within BACKGROUND_RADIUS of the background."""
    return np.linalg.norm(arr - np.array(BACKGROUND, dtype=np.float32), axis=-1) < BACKGROUND_RADIUS


def grow(mask: np.ndarray) -> np.ndarray:
    """A boolean [H, W] mask grown by one pixel in the 8 directions."""
    h, w = mask.shape
    padded, out = np.pad(mask, 1), np.zeros_like(mask)
    for dy in range(3):
        for dx in range(3):
            out |= padded[dy:dy + h, dx:dx + w]
    return out
