"""envs.render: grid text and images."""

import numpy as np
import pytest

from envs.render import Cell, grid_image, grid_text, panels_image, render_output

PALETTE = {"_": (255, 255, 255), "#": Cell((0, 0, 0)), "P": Cell((255, 255, 255), (("circle", (255, 0, 0)),))}


def test_grid_text_is_one_row_per_line_without_separators():
    assert grid_text([["#", "#"], ["_", "P"]]) == "##\n_P"


def test_grid_image_is_cell_px_per_cell_rgb():
    image = grid_image([["#", "_", "_"], ["_", "P", "_"]], PALETTE)
    assert (image.mode, image.size) == ("RGB", (3 * 28, 2 * 28))
    assert grid_image([["#"]], PALETTE, cell_px=10).size == (10, 10)


def test_grid_image_draws_the_mark_inside_its_cell_only():
    pixels = np.asarray(grid_image([["_", "P"]], PALETTE))
    assert tuple(pixels[14, 14]) == (255, 255, 255)       # plain cell centre
    assert tuple(pixels[14, 28 + 14]) == (255, 0, 0)      # the player's dot at its cell centre
    assert tuple(pixels[2, 28 + 2]) == (255, 255, 255)    # the cell's corner keeps its background


def test_unknown_symbol_and_shape_are_errors_that_name_them():
    with pytest.raises(ValueError, match="'Z'"):
        grid_image([["Z"]], PALETTE)
    with pytest.raises(ValueError, match="blob"):
        Cell((0, 0, 0), (("blob", (1, 1, 1)),))


def test_panels_image_and_render_output():
    image = panels_image([(255, 0, 0), (0, 0, 255)], panel_px=20, highlight=1)
    pixels = np.asarray(image)
    assert image.size == (40, 20) and tuple(pixels[10, 10]) == (255, 0, 0) and tuple(pixels[10, 30]) == (0, 0, 255)
    assert tuple(pixels[0, 30]) == (255, 255, 255)        # the highlighted panel's frame
    obs = {"text": "ab", "image": image}
    assert render_output("ansi", obs) == "ab"
    array = render_output("rgb_array", obs)
    assert array.dtype == np.uint8 and array.shape == (20, 40, 3)
