"""Grids of cell symbols -> text and PIL images; pure functions shared by the built-in environments.

A grid is a list of rows, each a list of one-character symbols. Its text is one row per line,
one symbol per cell, no separators. Its image is `cell_px` pixels per cell (28 by default:
Qwen2.5-VL merges 28x28 pixels into one image token, so one token per cell), each cell filled with
its symbol's background colour, outlined a little darker, with marks (the player, a box, a target)
drawn as simple shapes on top so every cell stays recognisable.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from gymnasium import spaces
from PIL import Image, ImageDraw

RGB = tuple[int, int, int]
Grid = Sequence[Sequence[str]]

CELL_PX = 28
FREE_TEXT = string.printable  # the charset of a free-form text observation
SHAPES = ("circle", "ring", "square", "cross", "diamond")


@dataclass(frozen=True)
class Cell:
    """How one symbol is drawn: a background colour and marks `(shape, colour)` painted on top in order."""

    background: RGB
    marks: tuple[tuple[str, RGB], ...] = ()

    def __post_init__(self) -> None:
        unknown = [shape for shape, _ in self.marks if shape not in SHAPES]
        if unknown:
            raise ValueError(f"unknown shape(s) {unknown}; valid shapes: {', '.join(SHAPES)}")


def grid_text(grid: Grid) -> str:
    """One row per line, one symbol per cell, no separators."""
    return "\n".join("".join(row) for row in grid)


def _darker(colour: RGB, factor: float = 0.75) -> RGB:
    return tuple(int(c * factor) for c in colour)  # type: ignore[return-value]


def _draw_mark(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], shape: str, colour: RGB) -> None:
    """One shape inside the cell `box` (left, top, right, bottom, inclusive)."""
    x0, y0, x1, y1 = box
    size = x1 - x0 + 1
    if shape == "ring":
        m = max(1, size // 10)
        draw.ellipse((x0 + m, y0 + m, x1 - m, y1 - m), outline=colour, width=max(1, size // 9))
        return
    m = max(1, size // 4) if shape == "circle" else max(1, size // 6)
    inner = (x0 + m, y0 + m, x1 - m, y1 - m)
    if shape == "circle":
        draw.ellipse(inner, fill=colour)
    elif shape == "square":
        draw.rectangle(inner, fill=colour, outline=_darker(colour), width=max(1, size // 14))
    elif shape == "diamond":
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        r = (size - 2 * m) / 2
        draw.polygon([(cx, cy - r), (x1 - m, cy), (cx, cy + r), (x0 + m, cy)], fill=colour)
    elif shape == "cross":
        w = max(1, size // 7)
        draw.line((inner[0], inner[1], inner[2], inner[3]), fill=colour, width=w)
        draw.line((inner[0], inner[3], inner[2], inner[1]), fill=colour, width=w)


def _style(symbol: str, palette: Mapping[str, Cell | RGB]) -> Cell:
    if symbol not in palette:
        raise ValueError(f"symbol {symbol!r} has no colour in the palette; it has: {''.join(palette)}")
    style = palette[symbol]
    return style if isinstance(style, Cell) else Cell(tuple(style))  # type: ignore[arg-type]


def grid_image(grid: Grid, palette: Mapping[str, Cell | RGB], cell_px: int = CELL_PX) -> Image.Image:
    """An RGB image of `cell_px` pixels per cell; `palette` maps each symbol to a `Cell` (or a plain colour)."""
    rows, cols = len(grid), max((len(r) for r in grid), default=0)
    image = Image.new("RGB", (cols * cell_px, rows * cell_px))
    draw = ImageDraw.Draw(image)
    for r, row in enumerate(grid):
        for c, symbol in enumerate(row):
            style = _style(symbol, palette)
            box = (c * cell_px, r * cell_px, (c + 1) * cell_px - 1, (r + 1) * cell_px - 1)
            draw.rectangle(box, fill=style.background, outline=_darker(style.background))
            for shape, colour in style.marks:
                _draw_mark(draw, box, shape, colour)
    return image


def panels_image(colours: Sequence[RGB], panel_px: int = 2 * CELL_PX, highlight: int | None = None) -> Image.Image:
    """Square panels side by side, one per colour; the `highlight`-th one framed in white."""
    image = Image.new("RGB", (len(colours) * panel_px, panel_px))
    draw = ImageDraw.Draw(image)
    frame = max(2, panel_px // 10)
    for i, colour in enumerate(colours):
        box = (i * panel_px, 0, (i + 1) * panel_px - 1, panel_px - 1)
        draw.rectangle(box, fill=colour, outline=_darker(colour), width=max(1, panel_px // 28))
        if i == highlight:
            draw.rectangle(box, outline=(255, 255, 255), width=frame)
    return image


def render_output(mode: str, obs: Mapping[str, object]) -> np.ndarray | str:
    """What `Env.render()` returns: the image as an HxWx3 uint8 array ('rgb_array') or the text ('ansi')."""
    if mode == "ansi":
        return str(obs["text"])
    return np.asarray(obs["image"], dtype=np.uint8).copy()


def check_render_mode(render_mode: str | None, env: str) -> str:
    """The render mode to use ('rgb_array' when None); anything but 'rgb_array' / 'ansi' is an error."""
    mode = render_mode or "rgb_array"
    if mode not in ("rgb_array", "ansi"):
        raise ValueError(f"{env}: render_mode must be 'rgb_array' or 'ansi', not {render_mode!r}")
    return mode


def observation_space(max_text: int, charset: str, image_hw: tuple[int, int] | None) -> spaces.Dict:
    """The observation space: a text of at most `max_text` characters of `charset`, and an RGB image.

    The image is a PIL image in the observations; the space describes it as the HxWx3 uint8 array
    it converts to.
    """
    parts: dict[str, spaces.Space] = {"text": spaces.Text(max_length=max_text, min_length=0, charset=charset)}
    if image_hw is not None:
        parts["image"] = spaces.Box(0, 255, shape=(*image_hw, 3), dtype=np.uint8)
    return spaces.Dict(parts)


def grid_observation_space(rows: int, cols: int, symbols: str, cell_px: int = CELL_PX) -> spaces.Dict:
    """The observation space of a grid environment: its text grid and its image."""
    return observation_space(rows * (cols + 1), symbols + "\n", (rows * cell_px, cols * cell_px))

