"""parse_action: the one reader of action text."""

import pytest

from envs import parse_action

LAKE = ("left", "down", "right", "up")


@pytest.mark.parametrize("text, expected", [
    ("left", 0), ("LEFT", 0), ("Up", 3), ("  right\n", 2),
    ("down.", 1), ("up!", 3), ("**Left**", 0), ("`up`", 3), ('"right"', 2), ("'down'?", 1), ("left;", 0),
    (": up :", 3), ("2", 2), (" 0 ", 0), ("3.", 3),
    ("jump", None), ("", None), ("   ", None), ("left right", None), ("go left", None), ("left-", None),
    ("4", None), ("-1", None), ("1.5", None), ("lef", None), ("lefts", None), ("²", None),
])
def test_parse_action_table(text, expected):
    assert parse_action(text, LAKE) == expected


def test_parse_action_matches_names_case_insensitively_both_ways():
    assert parse_action("dragon", ("Phoenix", "Dragon")) == 1
    assert parse_action("PHOENIX", ("Phoenix", "Dragon")) == 0


def test_parse_action_rejects_non_text():
    assert parse_action(None, LAKE) is None  # type: ignore[arg-type]
    assert parse_action(2, LAKE) is None  # type: ignore[arg-type]
