"""The shapes-world verifiers (rewards/shapes/verify.py) on scenes drawn by the world's renderer."""

import pytest
from PIL import Image, ImageDraw

from rewards.sample import Sample
from rewards.shapes.palette import BACKGROUND, COLORS
from rewards.shapes.verify import find_blobs, score_image, shapes_t2i, shapes_vlm
from shapes_world.scene import Scene, Shape, render
from shapes_world.tasks import render_prompt, t2i_prompt_space, t2i_records


def test_blob_shapes_are_classified_at_both_sizes():
    for size in (32, 56):
        side = size // 4
        for kind in ("circle", "square", "triangle"):
            img = render(Scene(size, (Shape(kind, "red", (2, 2, 2 + side, 2 + side)),)))
            (blob,) = find_blobs(img)
            assert (blob.color, blob.kind) == ("red", kind)


@pytest.mark.parametrize("spec", t2i_prompt_space()[::5])
def test_rendered_prompts_score_one(spec):
    assert score_image(render_prompt(spec, seed=1), spec["color"], spec["shape"], spec["count"], spec["position"]) == 1.0


def test_score_table_by_hand():
    two_red_circles = render(Scene(32, (Shape("circle", "red", (2, 2, 10, 10)), Shape("circle", "red", (20, 2, 28, 10)))))
    assert score_image(two_red_circles, "red", "circle", 2) == 1.0
    assert score_image(two_red_circles, "red", "circle", 1) == pytest.approx(2 / 3)   # count wrong
    assert score_image(two_red_circles, "red", "square", 2) == pytest.approx(2 / 3)   # shape wrong
    assert score_image(two_red_circles, "blue", "circle", 2) == 0.0                   # colour absent
    assert score_image(two_red_circles, "red", "circle", 1, "left") == pytest.approx(2 / 4)  # count, side wrong
    blank = Image.new("RGB", (32, 32), BACKGROUND)
    assert score_image(blank, "green", "square", 1) == 0.0


def test_noise_specks_are_not_blobs():
    img = Image.new("RGB", (32, 32), BACKGROUND)
    ImageDraw.Draw(img).point([(5, 5), (20, 20)], fill=COLORS["blue"])
    assert find_blobs(img) == []


def test_reward_functions_read_the_spec_from_meta():
    spec = t2i_records("train")[0]
    good = Sample(spec["prompt"], render_prompt(spec, 0), meta=spec)
    assert shapes_t2i([good, Sample("x", "text", meta=spec), Sample("x", good.output)]) == [1.0, None, None]
    vlm = [Sample("q", "<answer>2</answer>", answer="2", meta={"task": "count"}),
           Sample("q", "<answer>Red</answer>", answer="red", meta={"task": "attribute"}),
           Sample("q", "<answer>no</answer>", answer="yes", meta={"task": "relation"}),
           Sample("q", "<answer>[0, 0, 10, 10]</answer>", answer=[0, 0, 10, 10], meta={"task": "grounding"}),
           Sample("q", "<answer>1</answer>", answer="1", meta={})]
    assert shapes_vlm(vlm) == [1.0, 1.0, 0.0, 1.0, None]


def _two_red_circles() -> Image.Image:
    return render(Scene(32, (Shape("circle", "red", (2, 2, 10, 10)), Shape("circle", "red", (20, 2, 28, 10)))))


def _paint(image: Image.Image, pixels: list[tuple[int, int]], colour) -> Image.Image:
    out = image.copy()
    ImageDraw.Draw(out).point(pixels, fill=colour)
    return out


# a 32 x 32 image has 1024 pixels; clutter costs nothing up to 0.04 and zeroes the score at 0.16
# (cleanliness = (0.16 - clutter) / 0.12)
BOTTOM_ROWS = [(x, y) for y in range(22, 32) for x in range(32)]            # 320 pixels, far from both circles
SPECKS = [(x, y) for x, y in BOTTOM_ROWS if (x + y) % 2 == 0]               # 160 pixels, no two 4-connected


@pytest.mark.parametrize("pixels, colour, clutter, factor", [
    (BOTTOM_ROWS[:40], (255, 190, 210), 40 / 1024, 1.0),                # pastel tint (70 from white) within the free share
    (BOTTOM_ROWS[:100], (255, 190, 210), 100 / 1024, (0.16 - 100 / 1024) / 0.12),   # ~0.49
    (BOTTOM_ROWS[:200], (255, 190, 210), 200 / 1024, 0.0),               # 0.195 > 0.16: nothing left
    (BOTTOM_ROWS[:100], (235, 235, 235), 0.0, 1.0),                      # off-white (35 from white) is background
    (SPECKS[:32], COLORS["red"], 32 / 1024, 1.0),                        # red specks too small to be blobs: clutter
    (SPECKS[:100], COLORS["red"], 100 / 1024, (0.16 - 100 / 1024) / 0.12),
])
def test_clutter_outside_the_asked_blobs_scales_the_score_down(pixels, colour, clutter, factor):
    from rewards.shapes.verify import clutter_fraction

    image = _paint(_two_red_circles(), pixels, colour)
    assert clutter_fraction(image, "red") == pytest.approx(clutter)
    assert score_image(image, "red", "circle", 2) == pytest.approx(factor)
    assert score_image(image, "red", "circle", 2, blind=True) == 1.0     # the old verifier sees none of it


def test_a_shape_of_another_colour_is_clutter_and_the_asked_shapes_soft_edges_are_not():
    from rewards.shapes.verify import clutter_fraction

    image = _two_red_circles()
    ImageDraw.Draw(image).rectangle((12, 20, 19, 27), fill=COLORS["blue"])          # 64 pixels
    assert clutter_fraction(image, "red") == pytest.approx(64 / 1024)
    assert score_image(image, "red", "circle", 2) == pytest.approx((0.16 - 64 / 1024) / 0.12)
    ring = [(x, 10) for x in range(4, 8)] + [(x, 10) for x in range(22, 26)]      # one-pixel pale rim under each circle
    assert clutter_fraction(_paint(_two_red_circles(), ring, (240, 160, 160)), "red") == 0.0


def test_blind_keyword_reaches_the_registered_reward():
    spec = t2i_records("train")[0]
    image = render_prompt(spec, 0)
    noisy = _paint(image, [(x, y) for y in range(32) for x in range(32) if (x + y) % 2 and image.getpixel((x, y)) == BACKGROUND],
                   (255, 190, 210))                                            # a pastel checkerboard background
    samples = [Sample(spec["prompt"], image, meta=spec), Sample(spec["prompt"], noisy, meta=spec)]
    assert shapes_t2i(samples) == [1.0, 0.0]
    assert shapes_t2i(samples, blind=True) == [1.0, 1.0]
