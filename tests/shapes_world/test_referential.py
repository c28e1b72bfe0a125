"""The referential game (shapes_world/referential.py): rounds are decided by the seed, the candidates' colours
differ (so naming the target's colour identifies it), the target's position is uniform, the speaker sees the
target and the listener the panels in order, and the listener's number decides the team's reward."""

from __future__ import annotations

import numpy as np
import pytest

from shapes_world.referential import PANEL, SHADES, ReferentialGame, candidates_image, panel, sample_round
from shapes_world.scene import COLORS


def test_rounds_follow_the_seed_with_distinct_colours():
    for seed in range(200):
        shapes, target = sample_round(seed)
        assert (shapes, target) == sample_round(seed)
        assert len({s.color for s in shapes}) == 4 and 0 <= target < 4
        for s in shapes:
            x1, y1, x2, y2 = s.box
            assert 6 <= x1 and x2 <= PANEL - 6 and 6 <= y1 and y2 <= PANEL - 6 and 24 <= x2 - x1 <= 36
    targets = [sample_round(seed)[1] for seed in range(2000)]
    assert all(abs(targets.count(i) / 2000 - 0.25) < 0.04 for i in range(4))     # a listener's guess: 1/4


def test_the_speaker_sees_the_target_and_the_listener_the_panels_in_order():
    env = ReferentialGame()
    obs, info = env.reset(seed=5)
    shapes, target = sample_round(5)
    assert list(obs) == ["speaker"] and info["target"] == target + 1 and info["colour"] == shapes[target].color
    seen = np.asarray(obs["speaker"]["image"])
    assert seen.shape == (PANEL, PANEL, 3) and (seen == COLORS[shapes[target].color]).all(-1).sum() > 200
    obs, reward, term, _, _ = env.step({"speaker": f"  the {shapes[target].color}\n one "})
    assert reward == 0.0 and not term and list(obs) == ["listener"]
    assert obs["listener"]["text"].startswith(f"Your partner's message: the {shapes[target].color} one\n")
    grid = np.asarray(obs["listener"]["image"])
    assert grid.shape == (PANEL, 4 * PANEL, 3)
    for i, s in enumerate(shapes):                           # panel i: its shade, its shape's colour
        cell = grid[:, i * PANEL:(i + 1) * PANEL]
        assert (cell[0, 0] == SHADES[i]).all() and (cell == COLORS[s.color]).all(-1).sum() > 200
    assert np.array_equal(grid, np.asarray(candidates_image(shapes)))
    _, reward, term, _, info = env.step({"listener": str(target + 1)})
    assert (reward, term, info["success"]) == (1.0, True, True)


@pytest.mark.parametrize("answer, reward, valid", [("9", 0.0, False), (None, 0.0, False), ("wrong", 0.0, False)])
def test_a_listener_that_names_no_candidate_fails(answer, reward, valid):
    env = ReferentialGame()
    env.reset(seed=1)
    env.step({"speaker": None})                              # no message: the listener reads "(nothing)"
    _, r, term, _, info = env.step({"listener": answer})
    assert (r, term, info["success"], info["action_is_valid"]["listener"]) == (reward, True, False, valid)


def test_a_wrong_number_fails_and_misuse_is_an_error():
    env = ReferentialGame(candidates=3)
    _, info = env.reset(seed=2)
    env.step({"speaker": "x"})
    wrong = 1 if info["target"] != 1 else 2
    assert env.step({"listener": str(wrong)})[1] == 0.0
    with pytest.raises(RuntimeError, match="reset"):
        env.step({"listener": "1"})
    env.reset(seed=2)
    with pytest.raises(ValueError, match="acting role"):
        env.step({"listener": "1"})
    with pytest.raises(ValueError, match="candidates"):
        ReferentialGame(candidates=5)
    assert panel(sample_round(0)[0][0]).size == (PANEL, PANEL)


def test_without_distractors_only_the_targets_panel_holds_a_shape():
    """The pretraining curriculum's rounds (`distractors=False`): the other panels are their bare shade."""
    env = ReferentialGame(distractors=False)
    env.reset(seed=9)
    shapes, target = sample_round(9)
    grid = np.asarray(env.step({"speaker": "x"})[0]["listener"]["image"])
    for i, s in enumerate(shapes):
        cell = grid[:, i * PANEL:(i + 1) * PANEL]
        assert ((cell == COLORS[s.color]).all(-1).sum() > 200) == (i == target)
        if i != target:
            assert (cell == SHADES[i]).all()
