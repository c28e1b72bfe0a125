"""Built-in visual tools: look closer at the current observation image ("thinking with images").

Each takes the observation (injected, `tools.function`) and returns the chosen part of its image scaled up
to the whole image's size, so the part fills the pixels the model is given for an image (`policy.max_pixels`).
"""

from __future__ import annotations

from typing import Literal

from PIL import Image

Region = Literal["top-left", "top-right", "bottom-left", "bottom-right", "center"]
REGIONS = {                       # (left, top, right, bottom) as fractions of the image
    "top-left": (0.0, 0.0, 0.5, 0.5), "top-right": (0.5, 0.0, 1.0, 0.5),
    "bottom-left": (0.0, 0.5, 0.5, 1.0), "bottom-right": (0.5, 0.5, 1.0, 1.0),
    "center": (0.25, 0.25, 0.75, 0.75),
}


def _image(observation: dict) -> Image.Image:
    from PIL import Image as PILImage
    import numpy as np

    image = observation.get("image") if isinstance(observation, dict) else None
    if image is None:
        raise ValueError("the current observation has no image to look at")
    if isinstance(image, np.ndarray):
        image = PILImage.fromarray(image)
    return image.convert("RGB")


def _scaled(image: Image.Image, box: tuple[int, int, int, int]) -> Image.Image:
    return image.crop(box).resize(image.size, Image.Resampling.BICUBIC)


def zoom(region: Region, observation: dict) -> Image.Image:
    """Zoom into one region of the current image: it is shown again at full size.

    Args:
        region: Which part of the image to enlarge.
    """
    if region not in REGIONS:
        raise ValueError(f"unknown region {region!r}; the regions are: {', '.join(REGIONS)}")
    image = _image(observation)
    w, h = image.size
    left, top, right, bottom = REGIONS[region]
    return _scaled(image, (round(left * w), round(top * h), round(right * w), round(bottom * h)))


def crop(x1: int, y1: int, x2: int, y2: int, observation: dict) -> Image.Image:
    """Crop a box of the current image and show it at full size.

    Args:
        x1: Left edge of the box, in pixels from the image's left.
        y1: Top edge of the box, in pixels from the image's top.
        x2: Right edge of the box (exclusive), in pixels.
        y2: Bottom edge of the box (exclusive), in pixels.
    """
    image = _image(observation)
    w, h = image.size
    if not (0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h):
        raise ValueError(f"the box ({x1}, {y1}, {x2}, {y2}) is not inside the {w}x{h} image with x1 < x2 and y1 < y2")
    return _scaled(image, (x1, y1, x2, y2))
