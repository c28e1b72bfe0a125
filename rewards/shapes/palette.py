"""The shapes world's vocabulary, defined once: its shape kinds, its colour names and their RGB
values, and the canvas colour. The scene generator (shapes_world/scene.py) draws with these
values and the verifier (rewards/shapes/verify.py) looks for them, so the two always agree."""

SHAPES = ("circle", "square", "triangle")
COLORS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (30, 60, 220), "yellow": (230, 200, 20)}
BACKGROUND = (255, 255, 255)
