"""Grounding IoU: hand-computed boxes, parsing, and mapping from the model's resized frame."""

import pytest
from PIL import Image

from rewards.builtin.grounding import box_iou, iou, map_box, parse_box
from rewards.sample import Sample


def S(output, answer, resize=None):
    meta = {} if resize is None else {"resize": resize}
    return Sample(prompt="find the cat", output=output, answer=answer, meta=meta)


@pytest.mark.parametrize("a, b, expected", [
    ([0, 0, 10, 10], [0, 0, 10, 10], 1.0),
    ([0, 0, 10, 10], [5, 0, 15, 10], 50 / 150),
    ([0, 0, 10, 10], [5, 5, 15, 15], 25 / 175),
    ([0, 0, 10, 10], [2, 2, 4, 4], 4 / 100),
    ([0, 0, 10, 10], [10, 0, 20, 10], 0.0),       # touching edges
    ([0, 0, 10, 10], [20, 20, 30, 30], 0.0),
    ([10, 10, 0, 0], [0, 0, 10, 10], 0.0),        # reversed corners: zero area
    ([3, 3, 3, 3], [3, 3, 3, 3], 0.0),            # empty union
])
def test_box_iou(a, b, expected):
    assert box_iou(a, b) == pytest.approx(expected)
    assert box_iou(b, a) == pytest.approx(expected)


@pytest.mark.parametrize("box, src, dst, expected", [
    ([10, 20, 30, 40], [100, 100], [200, 100], [20, 20, 60, 40]),
    ([14, 28, 28, 56], [28, 56], [56, 28], [28, 14, 56, 28]),
    ([1, 2, 3, 4], [50, 50], [50, 50], [1, 2, 3, 4]),
])
def test_map_box(box, src, dst, expected):
    assert map_box(box, src, dst) == pytest.approx(expected)


@pytest.mark.parametrize("output, expected", [
    ("<answer>[10, 20, 30, 40]</answer>", [10, 20, 30, 40]),
    ('<answer>{"bbox_2d": [1.5, 2, 3, 4.25], "label": "cat"}</answer>', [1.5, 2, 3, 4.25]),
    ("<answer>[0,0,1,1] no, [5, 6, 7, 8]</answer>", [5, 6, 7, 8]),           # last box
    ("<think>[9, 9, 9, 9]</think><answer>(1, 2, 3, 4)</answer>", [1, 2, 3, 4]),  # answer tag wins
    ("<answer>x1=1 y1=2 x2=3 y2=4</answer>", [1, 2, 3, 4]),                  # exactly 4 numbers
    ("[1, 2, 3, 4]", [1, 2, 3, 4]),
    ("<answer>1 2 3</answer>", None),
    ("<answer>the cat is on the left</answer>", None),
])
def test_parse_box(output, expected):
    assert parse_box(output) == expected


def test_iou_table_without_resize():
    samples = [
        S("<answer>[0, 0, 10, 10]</answer>", [0, 0, 10, 10]),
        S("<answer>[5, 0, 15, 10]</answer>", [0, 0, 10, 10]),
        S("<answer>no box</answer>", [0, 0, 10, 10]),
        S("<answer>[0, 0, 10, 10]</answer>", "[0, 0, 10, 10]"),   # gold as JSON text
        S("<answer>[0, 0, 10, 10]</answer>", None),
        S("<answer>[0, 0, 10, 10]</answer>", [1, 2, 3]),
        S(Image.new("RGB", (4, 4)), [0, 0, 10, 10]),
    ]
    assert iou(samples) == pytest.approx([1.0, 1 / 3, 0.0, 1.0, None, None, None])


def test_iou_maps_prediction_from_downscaled_model_frame():
    """The model saw a 2x downscaled image: its box is half the gold; IoU is 1 only after mapping."""
    gold = [100, 60, 300, 200]                         # original 640x480 frame
    resize = [{"original_size": [640, 480], "model_size": [320, 240]},
              {"original_size": [100, 100], "model_size": [100, 100]}]   # second image ignored
    sample = S("<answer>[50, 30, 150, 100]</answer>", gold, resize=resize)
    assert iou([sample]) == [pytest.approx(1.0)]
    unmapped = box_iou([50, 30, 150, 100], gold)       # what skipping the mapping would give
    assert unmapped == pytest.approx(2000 / 33000)     # overlap 50x40 / (7000 + 28000 - 2000)
    assert iou([S(sample.output, gold)]) == [pytest.approx(unmapped)]   # no record: same frame


def test_iou_anisotropic_resize():
    resize = [{"original_size": [200, 100], "model_size": [56, 56]}]
    # model-frame box [14, 14, 42, 42] -> x * 200/56, y * 100/56
    expected_box = [50.0, 25.0, 150.0, 75.0]
    assert iou([S("<answer>[14, 14, 42, 42]</answer>", expected_box, resize)]) == [pytest.approx(1.0)]


@pytest.mark.parametrize("resize", [[{"original_size": [10, 10]}], [{"original_size": [0, 10], "model_size": [5, 5]}],
                                    ["not a dict"]])
def test_iou_malformed_resize_is_none(resize):
    assert iou([S("<answer>[0, 0, 1, 1]</answer>", [0, 0, 1, 1], resize)]) == [None]


@pytest.mark.parametrize("threshold, expected", [(0.5, [1.0, 0.0, 0.0]), (1 / 3, [1.0, 1.0, 0.0]), (0.0, [1.0, 1.0, 1.0])])
def test_iou_threshold(threshold, expected):
    gold = [0, 0, 10, 10]
    samples = [S("[0, 0, 10, 10]", gold), S("[5, 0, 15, 10]", gold), S("[20, 20, 30, 30]", gold)]
    assert iou(samples, threshold=threshold) == expected


@pytest.mark.parametrize("threshold", [-0.1, 1.5, "high"])
def test_iou_bad_threshold(threshold):
    with pytest.raises(ValueError, match="threshold"):
        iou([S("[0, 0, 1, 1]", [0, 0, 1, 1])], threshold=threshold)
