"""Image references -> RGB PIL images in the model's frame, with a resize record per image.

A reference is a file path (relative paths are resolved against a root folder: the dataset
file's folder for `vlm.data:load`, else `policy.image_root`, else the working directory),
raw bytes, a `{"bytes": ..., "path": ...}` mapping (Hugging Face `Image` features, veRL
parquet), or a `PIL.Image.Image`. Decoding is lazy: records keep references, and images are
opened only when a prompt is rolled out.

The resize record `{"original_size": [W0, H0], "model_size": [W1, H1]}` is what
`rewards.builtin.grounding.iou` uses to map predicted boxes back to the label's frame.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass

from PIL import Image


class ImageError(ValueError):
    """An image reference that cannot be opened or decoded (the message says why)."""


@dataclass(frozen=True)
class ResizePolicy:
    """How input images are sized for the model (Qwen2-VL `smart_resize` semantics).

    factor:     both sides become multiples of it (patch_size * merge_size: 28 for Qwen2/2.5-VL,
                32 for Qwen3-VL; 1 = no rounding).
    min_pixels / max_pixels: bounds on W1 * H1, aspect ratio kept as closely as possible.
    """

    factor: int = 28
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280


def describe(ref) -> str:
    """A short human-readable name of a reference, for error messages."""
    if isinstance(ref, str):
        return repr(ref)
    if isinstance(ref, dict):
        return repr(ref.get("path")) if ref.get("path") else "<embedded bytes>"
    if isinstance(ref, (bytes, bytearray)):
        return f"<{len(ref)} bytes>"
    return f"<{type(ref).__name__}>"


def _source(ref, root: str | None):
    """(bytes or path) to hand to PIL for `ref`."""
    if isinstance(ref, dict):
        if ref.get("bytes"):
            return io.BytesIO(ref["bytes"])
        if ref.get("path"):
            ref = ref["path"]
        else:
            raise ImageError("image mapping has neither 'bytes' nor 'path'")
    if isinstance(ref, (bytes, bytearray)):
        return io.BytesIO(ref)
    if isinstance(ref, str):
        if not ref:
            raise ImageError("empty image path")
        path = ref if os.path.isabs(ref) or root is None else os.path.join(root, ref)
        if not os.path.isfile(path):
            raise ImageError(f"image file {path!r} does not exist")
        return path
    raise ImageError(f"unsupported image reference of type {type(ref).__name__} "
                     "(use a path, bytes, {'bytes', 'path'} or a PIL image)")


def open_image(ref, root: str | None = None) -> Image.Image:
    """Decode `ref` into an RGB image (alpha composited on white, palettes expanded)."""
    if isinstance(ref, Image.Image):
        img = ref
    else:
        src = _source(ref, root)
        try:
            img = Image.open(src)
            img.load()
        except (OSError, SyntaxError, ValueError) as e:
            raise ImageError(f"image {describe(ref)} cannot be decoded ({e})") from None
    return to_rgb(img)


def check_image(ref, root: str | None = None) -> None:
    """Cheap validity check used when a dataset is loaded: the file exists and PIL can parse it."""
    if isinstance(ref, Image.Image):
        return
    src = _source(ref, root)
    try:
        with Image.open(src) as img:
            img.verify()
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"image {describe(ref)} is corrupt or not an image ({e})") from None


def to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def target_size(width: int, height: int, policy: ResizePolicy) -> tuple[int, int]:
    """(W1, H1): multiples of `factor` with min_pixels <= W1*H1 <= max_pixels.

    Follows Qwen2-VL's `smart_resize` (transformers `image_processing_qwen2_vl.py`), so the
    Qwen processor leaves an image of this size unchanged.
    """
    f = max(1, policy.factor)
    if min(width, height) < 1:
        raise ImageError(f"image has an empty side ({width}x{height})")
    if max(width, height) / min(width, height) > 200:
        raise ImageError(f"image aspect ratio {width}x{height} exceeds 200 (the Qwen-VL limit)")
    h_bar, w_bar = round(height / f) * f, round(width / f) * f
    if h_bar * w_bar > policy.max_pixels:
        beta = math.sqrt(height * width / policy.max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < policy.min_pixels:
        beta = math.sqrt(policy.min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return w_bar, h_bar


def resize(img: Image.Image, policy: ResizePolicy) -> tuple[Image.Image, dict]:
    """The image in the model frame and its resize record."""
    w0, h0 = img.size
    w1, h1 = target_size(w0, h0, policy)
    out = img if (w1, h1) == (w0, h0) else img.resize((w1, h1), Image.Resampling.BICUBIC)
    return out, {"original_size": [w0, h0], "model_size": [w1, h1]}


def load_images(refs: list, root: str | None, policy: ResizePolicy) -> tuple[list[Image.Image], list[dict]]:
    """Decode and resize every reference of one record."""
    images, records = [], []
    for ref in refs:
        img, rec = resize(open_image(ref, root), policy)
        images.append(img)
        records.append(rec)
    return images, records
