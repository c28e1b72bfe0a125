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
