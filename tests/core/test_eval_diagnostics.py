"""`eval.diagnostics`: reward entries scored on the held-out outputs only (never trained on), logged as
`eval/quality/<label>`, written next to the rewards in the eval samples, plotted and summarised."""

import json

import pytest

from mmrl.config.checks import check_all
from mmrl.config import ConfigError
from mmrl.reporting.summary import summary_text

DIAG = "eval.diagnostics=[{name: 'mmrl.testing.bandit:match', label: acc}]"


def test_diagnostics_are_logged_at_every_evaluation_and_never_in_training_rows(tmp_path, read_metrics, run_bandit):
    run_bandit(tmp_path, "max_steps=4", "eval.every=2", DIAG)
    rows = read_metrics(tmp_path)
    evals = [r for r in rows if "eval/reward/mean" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    for r in evals:                       # the same function as the reward: the same held-out mean
        assert r["eval/quality/acc"] == pytest.approx(r["eval/reward/mean"])
    assert all("eval/quality/acc" not in r for r in rows if "eval/reward/mean" not in r)
    first = json.loads(open(tmp_path / "samples" / "eval_step_000000.jsonl").readline())
    assert set(first["scores"]) == {"match", "quality/acc"}
    assert "quality/acc" in summary_text(rows)
    assert (tmp_path / "reward_curve.png").is_file()


def test_without_diagnostics_no_quality_key(tmp_path, read_metrics, run_bandit):
    run_bandit(tmp_path, "max_steps=2", "eval.every=2")
    assert not any(k.startswith("eval/quality/") for r in read_metrics(tmp_path) for k in r)


@pytest.mark.parametrize("entry, words", [
    ("[{name: no_such_metric}]", ["eval.diagnostics[0].name", "no_such_metric"]),
    ("[{label: x}]", ["eval.diagnostics[0]", "name"]),
    ("[{name: shapes_stray, bogus: 1}]", ["eval.diagnostics[0].name", "bogus", "threshold"]),
])
def test_a_bad_diagnostic_is_a_config_error_at_load(tmp_path, entry, words, bandit_cfg):
    with pytest.raises(ConfigError) as err:
        check_all(bandit_cfg(tmp_path, f"eval.diagnostics={entry}"))
    for w in words:
        assert w in str(err.value)


def test_the_episode_strip_labels_a_tool_call_by_the_call_not_as_invalid():
    from mmrl.episodes import EpisodeMeta
    from mmrl.loop.evaluation import reply_labels

    meta = {EpisodeMeta.ACTIONS: [None, "circle", None],
            EpisodeMeta.TOOL_CALLS: [[{"name": "zoom", "arguments": {"region": "top-right"}}], [],
                                     []]}
    assert reply_labels(meta) == ["zoom(top-right)", "circle", "(invalid)"]
    malformed = {EpisodeMeta.ACTIONS: [None], EpisodeMeta.TOOL_CALLS: [[{"name": "", "arguments": None},
                                                                         {"name": "crop", "arguments": {"x1": 1, "y1": 2}}]]}
    assert reply_labels(malformed) == ["?(...); crop(1, 2)"]
    assert reply_labels({EpisodeMeta.ACTIONS: ["left", None]}) == ["left", "(invalid)"]     # a run without tools


def test_a_multi_role_episode_strip_shows_every_roles_view_of_the_first_joint_episode(tmp_path, monkeypatch):
    """The speaker's target (56 x 56) and the listener's four candidates (224 x 56, its aspect kept) of the first
    held-out seed, each captioned with its role and move, the last one with the team's outcome; the next seed's
    samples are not in it."""
    from types import SimpleNamespace

    from PIL import Image

    from mmrl.episodes import EpisodeMeta
    from mmrl.loop.evaluation import _episode_strip

    def sample(seed, role, image, action, success):
        return SimpleNamespace(images=[image], meta={EpisodeMeta.SEED: seed, EpisodeMeta.ROLE: role,
                                                     EpisodeMeta.ACTIONS: [action], EpisodeMeta.SUCCESS: success})

    target, candidates = Image.new("RGB", (56, 56), "red"), Image.new("RGB", (224, 56), "blue")
    samples = [sample(7, "speaker", target, "red", True), sample(7, "listener", candidates, "2", True),
               sample(8, "speaker", target, None, False), sample(8, "listener", candidates, "1", False)]
    path = str(tmp_path / "strip.png")
    _episode_strip(path, samples)
    strip = Image.open(path).convert("RGB")
    assert strip.size == (112 + 4 + 448 + 4, 112 + 14)
    assert strip.getpixel((50, 50)) == (255, 0, 0) and strip.getpixel((116 + 300, 50)) == (0, 0, 255)
    seen = []
    monkeypatch.setattr("mmrl.loop.evaluation.write_strip", lambda p, images, captions: seen.append(captions))
    _episode_strip(path, samples)
    assert seen == [["speaker: red", "listener: 2 (solved)"]]
    monkeypatch.undo()
    single = str(tmp_path / "single.png")                        # a one-role episode: observations, then the end
    _episode_strip(single, [SimpleNamespace(images=[target], meta={EpisodeMeta.ACTIONS: ["left"],
                                                                   EpisodeMeta.FINAL_IMAGE: target})])
    assert Image.open(single).size == (2 * 116, 126)
