"""Grounding reward: IoU of a predicted box with the gold box, in the gold's (original) image frame.

Boxes are `[x1, y1, x2, y2]` in pixels. The VLM sees a resized image (Qwen2-VL rounds sizes to
28-pixel multiples), so its box is in the *model* frame; the dataloader records, per input image,
`sample.meta["resize"] = [{"original_size": [W0, H0], "model_size": [W1, H1]}, ...]`. The
prediction is mapped back to the original frame before IoU (VLM-R1 rescales; EasyR1 issue #302
is the bug when nobody does).
"""

from __future__ import annotations

import json
import re

from rewards.builtin.text import extract_answer
from rewards.registry import register

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)"
_BRACKET_BOX = re.compile(rf"[\[(]\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*,\s*({_NUM})\s*[\])]")


def box_iou(a, b) -> float:
    """Intersection over union of two `[x1, y1, x2, y2]` boxes, in [0, 1]; 0 if the union is empty.

    A box with x2 < x1 or y2 < y1 has zero area (it is not reordered).
    """
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    area = lambda r: max(0.0, r[2] - r[0]) * max(0.0, r[3] - r[1])  # noqa: E731
    union = area(a) + area(b) - inter
    return inter / union if union > 0 else 0.0


def map_box(box, from_size, to_size) -> list[float]:
    """Rescale a box from an image of `from_size` (W, H) to one of `to_size` (W, H)."""
    sx, sy = to_size[0] / from_size[0], to_size[1] / from_size[1]
    return [box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy]


def parse_box(text: str) -> list[float] | None:
    """The last box in the `<answer>` tag (or the whole text): a bracketed list of 4 numbers
    (`[1, 2, 3, 4]`, `{"bbox_2d": [1, 2, 3, 4]}`, `(1, 2, 3, 4)`), else exactly 4 bare numbers."""
    text = extract_answer(text)
    boxes = _BRACKET_BOX.findall(text)
    if boxes:
        return [float(v) for v in boxes[-1]]
    nums = re.findall(rf"(?<![\w.]){_NUM}", text)  # skip digits inside names such as "x1"
    return [float(v) for v in nums] if len(nums) == 4 else None


def _gold_box(answer) -> list[float] | None:
    if isinstance(answer, str):
        try:
            answer = json.loads(answer)
        except ValueError:
            return None
    if isinstance(answer, (list, tuple)) and len(answer) == 4:
        try:
            return [float(v) for v in answer]
        except (TypeError, ValueError):
            return None
    return None


def _frames(meta: dict):
    """(model_size, original_size) of the first input image; (None, None) if frames are identical.

    Raises ValueError for a malformed record (the caller scores that sample None).
    """
    record = meta.get("resize")
    if not record:
        return None, None
    first = record[0] if isinstance(record, (list, tuple)) else record
    model, orig = first["model_size"], first["original_size"]
    if min(model[0], model[1], orig[0], orig[1]) <= 0:
        raise ValueError(f"bad resize record {first!r}")
    return model, orig


def _iou_one(sample) -> float | None:
    gold = _gold_box(sample.answer)
    if not isinstance(sample.output, str) or gold is None:
        return None
    try:
        model_size, orig_size = _frames(sample.meta)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    pred = parse_box(sample.output)
    if pred is None:
        return 0.0
    if model_size is not None:
        pred = map_box(pred, model_size, orig_size)
    return box_iou(pred, gold)


@register("iou")
def iou(samples: list, threshold: float | None = None) -> list[float | None]:
    """IoU in [0, 1] of the predicted box (mapped to the original frame) with the gold box.

    With `threshold` set, 1.0 if IoU >= threshold else 0.0. An unparsable prediction scores 0.0;
    None if the output is not str, the gold is not 4 numbers, or `meta["resize"]` is malformed.
    """
    if threshold is not None and not (isinstance(threshold, (int, float)) and 0 <= threshold <= 1):
        raise ValueError(f"iou reward: threshold must be None or a number in [0, 1], got {threshold!r}")
    scores = [_iou_one(s) for s in samples]
    if threshold is None:
        return scores
    return [None if v is None else float(v >= threshold) for v in scores]
