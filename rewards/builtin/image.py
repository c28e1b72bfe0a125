"""JPEG (in)compressibility rewards for generated images (DDPO, arXiv 2305.13301).

The image is encoded as JPEG, quality 95, in memory; its size is measured in kB (1 kB = 1000
bytes, as in ddpo-pytorch). Non-image outputs score None.
"""

from __future__ import annotations

import io

from PIL import Image

from rewards.registry import register

JPEG_QUALITY = 95  # ddpo-pytorch's jpeg_compressibility


def jpeg_kb(image: Image.Image, quality: int = JPEG_QUALITY) -> float:
    """Size in kB (1000 bytes) of `image` encoded as RGB JPEG at `quality`."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000.0


def _sizes(samples: list) -> list[float | None]:
    return [jpeg_kb(s.output) if isinstance(s.output, Image.Image) else None for s in samples]


@register("jpeg_compressibility")
def jpeg_compressibility(samples: list) -> list[float | None]:
    """Minus the JPEG size in kB (<= 0; higher is more compressible); None for non-image output."""
    return [None if kb is None else -kb for kb in _sizes(samples)]


@register("jpeg_incompressibility")
def jpeg_incompressibility(samples: list) -> list[float | None]:
    """The JPEG size in kB (>= 0; higher is less compressible); None for non-image output."""
    return _sizes(samples)
