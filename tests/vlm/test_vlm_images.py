"""Image references, RGB conversion, Qwen-VL resizing and the resize record used to map boxes back."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from mmrl.types import PromptBatch
from vlm.images import ImageError, ResizePolicy, check_image, load_images, open_image, resize, target_size


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("size", [(64, 48), (500, 375), (13, 900), (1000, 20), (3000, 2000), (28, 28)])
def test_target_size_matches_transformers_smart_resize(size):
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    policy = ResizePolicy(factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 256)
    h, w = smart_resize(size[1], size[0], 28, min_pixels=policy.min_pixels, max_pixels=policy.max_pixels)
    assert target_size(*size, policy) == (w, h)


def test_references_decode_to_rgb(tmp_path):
    rgba = Image.new("RGBA", (10, 8), (255, 0, 0, 0))               # fully transparent -> white
    (tmp_path / "a.png").write_bytes(_png(rgba))
    for ref in ("a.png", _png(rgba), {"bytes": _png(rgba), "path": None}, {"bytes": None, "path": "a.png"}, rgba):
        img = open_image(ref, root=str(tmp_path))
        assert img.mode == "RGB" and img.size == (10, 8) and img.getpixel((0, 0)) == (255, 255, 255)
    assert open_image(Image.new("L", (4, 4), 7)).getpixel((1, 1)) == (7, 7, 7)
    assert open_image(Image.new("P", (4, 4))).mode == "RGB"


def test_bad_references_say_why(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(ImageError, match="does not exist"):
        open_image("missing.png", root=str(tmp_path))
    with pytest.raises(ImageError, match="cannot be decoded"):
        open_image("bad.png", root=str(tmp_path))
    with pytest.raises(ImageError, match="corrupt"):
        check_image("bad.png", root=str(tmp_path))
    with pytest.raises(ImageError, match="unsupported image reference"):
        open_image(3.5)


def test_resize_record():
    img, rec = resize(Image.new("RGB", (100, 50)), ResizePolicy(28, 784, 28 * 28 * 4))
    assert rec == {"original_size": [100, 50], "model_size": list(img.size)}
    assert img.size[0] % 28 == 0 and img.size[1] % 28 == 0 and img.size[0] * img.size[1] <= 28 * 28 * 4
    images, records = load_images([Image.new("RGB", (30, 30)), Image.new("RGB", (90, 60))], None, ResizePolicy(28, 784, 3136))
    assert [r["original_size"] for r in records] == [[30, 30], [90, 60]] and len(images) == 2


def test_box_round_trip_through_a_rollout(make_policy):
    """A box the model would write in its (resized) frame scores IoU 1 against the original-frame gold."""
    from rewards.builtin.grounding import iou, map_box
    from shapes_world.standins import grounding

    row = grounding(n=1, seed=3, width=90, height=70)[0]
    policy = make_policy("qwen2_5_vl", min_pixels=784, max_pixels=28 * 28 * 6, max_new_tokens=2)
    ro = policy.rollout(PromptBatch(rows=[row], index=[0], seeds=[0], step=0), group_size=1)
    sample = ro.samples[0]
    record = sample.meta["resize"][0]
    assert record["original_size"] == [90, 70] and record["model_size"] != [90, 70]
    assert sample.images[0].size == tuple(record["model_size"])       # rewards see what the model saw
    model_box = map_box(row["answer"], record["original_size"], record["model_size"])
    answer = "<think>it is there</think><answer>[" + ", ".join(f"{v:.3f}" for v in model_box) + "]</answer>"
    scored = [type(sample)(prompt=sample.prompt, output=answer, images=sample.images, answer=sample.answer,
                           meta=sample.meta)]
    assert iou(scored)[0] == pytest.approx(1.0, abs=1e-3)
    unmapped = [type(sample)(prompt="", output=answer, answer=sample.answer, meta={})]
    assert iou(unmapped)[0] < 0.9                                     # EasyR1 issue #302 without the record
