"""The shapes world's stray-background fraction (rewards/shapes/quality.py), a diagnostic, not a reward."""

import pytest
from PIL import Image, ImageDraw

from rewards.registry import resolve
from rewards.sample import Sample
from rewards.shapes.palette import BACKGROUND, COLORS
from rewards.shapes.quality import stray_fraction
from shapes_world.tasks import render_prompt, t2i_prompt_space


@pytest.mark.parametrize("spec", t2i_prompt_space()[::7])
def test_the_worlds_own_images_have_no_stray_pixels(spec):
    assert stray_fraction(render_prompt(spec, seed=3)) == 0.0


def test_stray_table_by_hand():
    image = Image.new("RGB", (32, 32), BACKGROUND)                    # 1024 pixels
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, 7, 7), fill=COLORS["blue"])                  # palette colour: never stray
    draw.rectangle((8, 0, 8, 7), fill=(150, 150, 150))                 # grey column touching the square: a soft edge
    draw.rectangle((0, 20, 15, 23), fill=(255, 190, 210))              # 64 pastel pixels away from any shape: stray
    draw.rectangle((20, 20, 23, 23), fill=(240, 240, 240))             # 16 off-white pixels: background
    draw.rectangle((28, 0, 31, 0), fill=(128, 0, 128))                 # 4 purple pixels (not a palette colour): stray
    assert stray_fraction(image) == pytest.approx(68 / 1024)


def test_registered_as_shapes_stray_and_skips_text():
    fn = resolve("shapes_stray")
    tinted = Image.new("RGB", (8, 8), (255, 190, 210))
    assert fn([Sample("p", tinted), Sample("p", "text")]) == [1.0, None]
