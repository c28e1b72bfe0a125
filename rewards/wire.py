"""The JSON form of a batch of `Sample`s and of its scores: shared by `mmrl rewards serve`
(rewards/server.py) and the `remote` reward (rewards/builtin/remote.py).

    POST /score   (header `Authorization: Bearer TOKEN` when the server has a token)
      request   {"samples": [{"id": str,
                              "prompt": str,
                              "output": {"text": str} | {"image_png_b64": str}
                                        | {"video_png_b64": [str, ...], "fps": float},  # frames in order
                              "images": [str, ...],           # input images, each a base64 PNG
                              "answer": any JSON value or null,
                              "meta": {str: any JSON value}}, ...]}
      response  {"scores": [float | null, ...],               # one per sample, in order; null = unscorable
                 "errors": [str | null, ...]}                 # per sample: the error of a reward that raised
    GET /health
      response  {"status": "ok", "reward": str}

Status codes: 400 body is not JSON, 401 missing or wrong token, 413 body over the size cap,
422 a field does not fit the schema (the message names it: `samples[3].output`), 500 the reward is
broken beyond per-sample isolation (the message is its error). Only `output` is required in a
sample; `id` and `prompt` default to "", `images` to [], `answer` to null, `meta` to {}.

Exactness: images (and a video's frames) travel as PNG (lossless, mode kept); a score is written with Python's shortest
round-tripping float repr, so the client reads back the very double the reward returned. `answer`
and `meta` travel as JSON: tuples arrive as lists and mapping keys as strings.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
from typing import Any

from rewards.sample import Sample, Video

SAMPLE_KEYS = ("id", "prompt", "output", "images", "answer", "meta")


class WireError(ValueError):
    """A request or response that does not fit the schema; the message names the field."""


def require(module: str, what: str):
    """Import a dependency of the `serve` extra (fastapi, uvicorn, httpx), or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs the '{module}' package of the 'serve' extra: "
                          f"pip install \"mmrl[serve]\" (or fastapi uvicorn httpx)") from None


# ---------------------------------------------------------------- images

def image_to_b64(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)     # lossless either way; 1 is ~4x faster than 6
    return base64.b64encode(buf.getvalue()).decode("ascii")


def b64_to_image(text: Any, field: str):
    from PIL import Image, UnidentifiedImageError

    if not isinstance(text, str):
        raise WireError(f"{field}: expected a base64 PNG string, got {type(text).__name__}")
    try:
        image = Image.open(io.BytesIO(base64.b64decode(text, validate=True)))
        image.load()
    except (binascii.Error, ValueError) as e:
        raise WireError(f"{field}: not valid base64 ({e})") from None
    except (UnidentifiedImageError, OSError) as e:
        raise WireError(f"{field}: not a readable image ({e})") from None
    return image


# ---------------------------------------------------------------- samples (client side)

def _where(i: int, s: Sample) -> str:
    return f"samples[{i}] (id {s.id!r})" if s.id else f"samples[{i}]"


def encode_sample(s: Sample, i: int = 0) -> dict:
    """One `Sample` -> its JSON object; a WireError names the sample and the field that cannot travel."""
    if isinstance(s.output, str):
        output = {"text": s.output}
    elif hasattr(s.output, "save") and hasattr(s.output, "mode"):
        output = {"image_png_b64": image_to_b64(s.output)}
    elif isinstance(s.output, Video):
        output = {"video_png_b64": [image_to_b64(f) for f in s.output.frames], "fps": float(s.output.fps)}
    else:
        raise WireError(f"{_where(i, s)}.output: a remote reward scores a str, a PIL image or a Video, "
                        f"got {type(s.output).__name__}")
    for field in ("answer", "meta"):
        try:
            json.dumps(getattr(s, field), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise WireError(f"{_where(i, s)}.{field}: cannot be sent as JSON ({e})") from None
    return {"id": str(s.id), "prompt": str(s.prompt), "output": output,
            "images": [image_to_b64(im) for im in s.images], "answer": s.answer, "meta": dict(s.meta or {})}


def encode_request(samples: list[Sample]) -> bytes:
    """The body of POST /score."""
    return json.dumps({"samples": [encode_sample(s, i) for i, s in enumerate(samples)]},
                      allow_nan=False).encode()


# ---------------------------------------------------------------- samples (server side)

def _decode_output(value: Any, field: str):
    if isinstance(value, dict) and set(value) == {"text"} and isinstance(value["text"], str):
        return value["text"]
    if isinstance(value, dict) and set(value) == {"image_png_b64"}:
        return b64_to_image(value["image_png_b64"], f"{field}.image_png_b64")
    if isinstance(value, dict) and set(value) == {"video_png_b64", "fps"}:
        frames, fps = value["video_png_b64"], value["fps"]
        if not isinstance(frames, list) or not frames:
            raise WireError(f"{field}.video_png_b64: expected a non-empty list of base64 PNG frames, got {_short(frames)}")
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not fps > 0:
            raise WireError(f"{field}.fps: expected a number > 0, got {_short(fps)}")
        return Video(frames=[b64_to_image(f, f"{field}.video_png_b64[{k}]") for k, f in enumerate(frames)], fps=fps)
    raise WireError(f"{field}: expected {{\"text\": str}}, {{\"image_png_b64\": str}} or "
                    f"{{\"video_png_b64\": [str, ...], \"fps\": float}}, got {_short(value)}")


def decode_sample(obj: Any, i: int) -> Sample:
    where = f"samples[{i}]"
    if not isinstance(obj, dict):
        raise WireError(f"{where}: expected an object, got {_short(obj)}")
    unknown = sorted(set(obj) - set(SAMPLE_KEYS))
    if unknown:
        raise WireError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; valid: {', '.join(SAMPLE_KEYS)}")
    if "output" not in obj:
        raise WireError(f"{where}.output: missing (required)")
    for key, kind in (("id", str), ("prompt", str), ("images", list), ("meta", dict)):
        if key in obj and not isinstance(obj[key], kind):
            raise WireError(f"{where}.{key}: expected {kind.__name__}, got {_short(obj[key])}")
    images = [b64_to_image(im, f"{where}.images[{j}]") for j, im in enumerate(obj.get("images", []))]
    return Sample(prompt=obj.get("prompt", ""), output=_decode_output(obj["output"], f"{where}.output"), images=images,
                  answer=obj.get("answer"), meta=obj.get("meta", {}), id=obj.get("id", ""))


def decode_request(payload: Any) -> list[Sample]:
    """A parsed POST /score body -> the samples; a WireError names the first bad field."""
    if not isinstance(payload, dict) or "samples" not in payload:
        raise WireError(f"samples: missing; the body must be {{\"samples\": [...]}}, got {_short(payload)}")
    if not isinstance(payload["samples"], list):
        raise WireError(f"samples: expected a list, got {_short(payload['samples'])}")
    return [decode_sample(obj, i) for i, obj in enumerate(payload["samples"])]


# ---------------------------------------------------------------- scores

def score_value(v: Any) -> float | None:
    """A reward's value -> what travels: a finite float, or None (unscorable), as the scorer reads it."""
    if v is None:
        return None
    if isinstance(v, bool):
        return float(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def decode_scores(payload: Any, n: int) -> tuple[list[float | None], list[str | None]]:
    """A parsed POST /score response -> (scores, errors), each of length `n`."""
    scores = payload.get("scores") if isinstance(payload, dict) else None
    if not isinstance(scores, list) or len(scores) != n:
        raise WireError(f"scores: expected a list of {n} numbers or nulls, got {_short(scores)}")
    for j, v in enumerate(scores):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise WireError(f"scores[{j}]: expected a number or null, got {_short(v)}")
    errors = payload.get("errors") or [None] * n
    if not isinstance(errors, list) or len(errors) != n:
        raise WireError(f"errors: expected a list of {n} strings or nulls, got {_short(errors)}")
    return [None if v is None else float(v) for v in scores], [None if e is None else str(e) for e in errors]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= limit else text[:limit] + '...'}"
