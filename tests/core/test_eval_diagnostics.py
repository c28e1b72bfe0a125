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
