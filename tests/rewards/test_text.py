"""Text verifiers: hand-written tables of (output, answer) -> expected score."""

import threading

import pytest
from PIL import Image

from rewards.builtin import text
from rewards.sample import Sample


def S(output, answer=None, **meta):
    return Sample(prompt="q", output=output, answer=answer, meta=meta)


def one(fn, output, answer=None, meta=None, **kwargs):
    return fn([S(output, answer, **(meta or {}))], **kwargs)[0]


@pytest.mark.parametrize("output, expected", [
    ("<think>a</think><answer>b</answer>", 1.0),
    ("  <think>line\nline</think>\n<answer>\n42\n</answer>\n", 1.0),
    ("<answer>b</answer>", 0.0),
    ("<think>a</think>", 0.0),
    ("<think>a</think><answer>b</answer> trailing", 0.0),
    ("<answer>b</answer><think>a</think>", 0.0),
    (Image.new("RGB", (2, 2)), None),
])
def test_format_default_r1(output, expected):
    assert one(text.format_reward, output) == expected


def test_format_custom_pattern_and_bad_pattern():
    assert one(text.format_reward, "\\boxed{3}", pattern=r".*\\boxed\{.+\}.*") == 1.0
    assert one(text.format_reward, "3", pattern=r".*\\boxed\{.+\}.*") == 0.0
    with pytest.raises(ValueError, match="invalid regex"):
        one(text.format_reward, "x", pattern="(")


@pytest.mark.parametrize("output, expected", [
    ("<think>x</think><answer> 12 </answer>", "12"),
    ("<answer>1</answer> then <answer>2</answer>", "2"),
    ("  no tags here  ", "no tags here"),
    ("<answer>\nmulti\nline\n</answer>", "multi\nline"),
])
def test_extract_answer(output, expected):
    assert text.extract_answer(output) == expected


MATH_TABLE = [
    ("<answer>\\frac{1}{2}</answer>", "0.5", 1.0),
    ("<answer>1/2</answer>", "\\frac12", 1.0),
    ("<answer>x^2+1</answer>", "1 + x^2", 1.0),
    ("<think>...</think><answer>The answer is 12.</answer>", "12", 1.0),
    ("<answer>\\boxed{12}</answer>", 12, 1.0),
    ("<answer>x = 5</answer>", "5", 1.0),
    ("<answer>13</answer>", "12", 0.0),
    ("<answer>2\\pi</answer>", "6.28", 0.0),
    ("<answer></answer>", "1", 0.0),
    ("<answer>3</answer>", None, None),
    ("<answer>3</answer>", "", None),
    (Image.new("RGB", (2, 2)), "3", None),
]


@pytest.mark.parametrize("output, answer, expected", MATH_TABLE)
def test_math(output, answer, expected):
    assert one(text.math_reward, output, answer) == expected


def test_math_works_off_the_main_thread():
    """math-verify's default timeouts use signal.alarm, which raises in a thread."""
    out = {}
    samples = [S(o, a) for o, a, _ in MATH_TABLE]
    worker = threading.Thread(target=lambda: out.update(scores=text.math_reward(samples)))
    worker.start()
    worker.join(timeout=30)
    assert out["scores"] == [e for _, _, e in MATH_TABLE]


OPTS = ["Paris", "London", "Rome"]


@pytest.mark.parametrize("output, answer, meta, expected", [
    ("<answer>B</answer>", "B", {}, 1.0),
    ("<answer>(B)</answer>", "B", {}, 1.0),
    ("<answer>B.</answer>", "(b)", {}, 1.0),
    ("<answer>The answer is B</answer>", "B", {}, 1.0),
    ("<answer>Answer: (C)</answer>", "C", {}, 1.0),
    ("<answer>B) London</answer>", "B", {}, 1.0),
    ("<answer>C</answer>", "B", {}, 0.0),
    ("<answer>A cat</answer>", "A", {}, 0.0),          # the article "A" is not a choice
    ("<answer>London</answer>", "B", {"options": OPTS}, 1.0),
    ("<answer>B</answer>", "London", {"options": OPTS}, 1.0),
    ("<answer>A</answer>", "London", {"options": OPTS}, 0.0),
    ("<answer>rome</answer>", "Rome", {"options": {"A": "Paris", "C": "Rome"}}, 1.0),
    ("<answer>B</answer>", "London", {}, None),         # gold text without options: no letter
    ("<answer>B</answer>", None, {}, None),
    (Image.new("RGB", (2, 2)), "B", {}, None),
])
def test_choice(output, answer, meta, expected):
    assert one(text.choice, output, answer, meta) == expected


@pytest.mark.parametrize("output, answer, kwargs, expected", [
    ("<answer>42</answer>", 42, {}, 1.0),
    ("<answer>The answer is 42.</answer>", "42", {}, 1.0),
    ("<answer>1,000 apples</answer>", 1000, {}, 1.0),
    ("<answer>3/4</answer>", 0.75, {}, 1.0),
    ("<answer>-2.5e3</answer>", "-2500", {}, 1.0),
    ("<answer>3 then 4</answer>", 4, {}, 1.0),        # last number counts
    ("<answer>41</answer>", 42, {}, 0.0),
    ("<answer>3.14</answer>", 3.14159, {}, 0.0),
    ("<answer>3.14</answer>", 3.14159, {"abs_tol": 0.01}, 1.0),
    ("<answer>105</answer>", 100, {"rel_tol": 0.1}, 1.0),
    ("<answer>111</answer>", 100, {"rel_tol": 0.1}, 0.0),
    ("<answer>none</answer>", 1, {}, 0.0),
    ("<answer>1</answer>", "n/a", {}, None),
    (Image.new("RGB", (2, 2)), 1, {}, None),
])
def test_numeric(output, answer, kwargs, expected):
    assert one(text.numeric, output, answer, **kwargs) == expected


def test_numeric_bad_tolerance():
    with pytest.raises(ValueError, match="rel_tol"):
        one(text.numeric, "1", 1, rel_tol=-1)


@pytest.mark.parametrize("output, answer, kwargs, expected", [
    ("<answer>  Blue  Whale </answer>", "blue whale", {}, 1.0),
    ("<answer>Blue Whale</answer>", "blue whale", {"casefold": False}, 0.0),
    ("<answer>blue</answer>", "blue whale", {}, 0.0),
    ("<answer>orca</answer>", ["whale", "Orca"], {}, 1.0),
    ("<answer>x</answer>", None, {}, None),
])
def test_exact(output, answer, kwargs, expected):
    assert one(text.exact, output, answer, **kwargs) == expected


@pytest.mark.parametrize("output, answer, kwargs, expected", [
    ("it is a Blue Whale indeed", "blue whale", {}, 1.0),
    ("it is a Blue Whale", "blue whale", {"casefold": False}, 0.0),
    ("it is a whale", "blue whale", {}, 0.0),
    ("anything", "", {}, None),
    (Image.new("RGB", (2, 2)), "x", {}, None),
])
def test_contains(output, answer, kwargs, expected):
    assert one(text.contains, output, answer, **kwargs) == expected


# L = 10, C = 4: no penalty up to 6 tokens, linear to -1 at 10, -1 beyond.
@pytest.mark.parametrize("n, expected", [(0, 0.0), (6, 0.0), (7, -0.25), (8, -0.5), (10, -1.0), (11, -1.0), (50, -1.0)])
def test_overlong_from_num_tokens(n, expected):
    assert one(text.overlong, "ignored", meta={"num_tokens": n}, max_length=10, buffer=4) == expected


def test_overlong_whitespace_tokens_and_none():
    assert one(text.overlong, "a b c d e f g", max_length=10, buffer=4) == -0.25  # 7 words
    assert one(text.overlong, Image.new("RGB", (2, 2)), max_length=10, buffer=4) is None


@pytest.mark.parametrize("kwargs", [{}, {"max_length": 10}, {"max_length": 10, "buffer": 0},
                                    {"max_length": 4, "buffer": 5}, {"max_length": 10.5, "buffer": 2}])
def test_overlong_bad_config(kwargs):
    with pytest.raises(ValueError, match="max_length"):
        one(text.overlong, "x", **kwargs)
