"""`mmrl rewards list|score` and a user reward file used by `mmrl train`.

Each test asserts on the `mmrl` calls that CALLS lists for it; the module starts them all, two at a time,
when its first test runs (the `started` fixture in this folder's conftest.py)."""

import json

import pytest
from PIL import Image

from tests import BANDIT, REPO

pytestmark = pytest.mark.integration


def _flat_png(folder) -> str:
    img = folder / "flat.png"
    Image.new("RGB", (32, 32), (128, 128, 128)).save(img)
    return str(img)


def _flaky_reward(folder) -> str:
    flaky = folder / "flaky.py"
    flaky.write_text("def flaky(samples):\n"
                     "    if any(s.output.startswith('7') for s in samples) and len(samples) == 1:\n"
                     "        raise RuntimeError('seven')\n"
                     "    if len(samples) > 1 and any(s.output.startswith('7') for s in samples):\n"
                     "        raise RuntimeError('batch has a seven')\n"
                     "    return [1.0] * len(samples)\n")
    return f"rewards=[{{name: '{flaky}:flaky'}}]"


USER_REWARD = f"{REPO}/examples/my_reward.py:small_numbers"
CALLS = {  # test: function(its folder) -> the args of each `mmrl` call it asserts on
    "test_rewards_list_prints_one_line_per_reward": lambda d: [["rewards", "list"]],
    "test_rewards_score_text_and_image": lambda d: [
        ["rewards", "score", "format", "--output", "<think>a</think><answer>b</answer>"],
        ["rewards", "score", "numeric", "--output", "<answer>3.0</answer>", "--answer", "3"],
        ["rewards", "score", "jpeg_incompressibility", "--output-image", _flat_png(d)],
        ["rewards", "score", "iou", "--output", "[0, 0, 10, 10]", "--answer", "[0, 0, 20, 20]",
         "--meta", json.dumps({"resize": [{"original_size": [200, 200], "model_size": [100, 100]}]})]],
    "test_rewards_score_errors": lambda d: [["rewards", "score", "nope", "--output", "x"],
                                            ["rewards", "score", "format"]],
    "test_user_reward_file_is_called_during_training": lambda d: [
        ["train", BANDIT, f"output_dir={d}", "max_steps=3", "eval.every=0",
         f"rewards=[{{name: '{USER_REWARD}', scale: 8}}, {{name: 'mmrl.testing.bandit:match', label: match}}]"]],
    "test_reward_failing_on_some_samples_keeps_training": lambda d: [
        ["train", BANDIT, f"output_dir={d / 'run'}", "max_steps=3", "eval.every=0", _flaky_reward(d)]],
}


def test_rewards_list_prints_one_line_per_reward(cli_runs):
    _, (out,) = cli_runs
    assert out.returncode == 0
    names = [line.split()[0] for line in out.stdout.splitlines()]
    for name in ("format", "math", "iou", "clip_score", "jpeg_compressibility"):
        assert name in names


def test_rewards_score_text_and_image(cli_runs):
    _, (ok, num, jpeg, box) = cli_runs
    assert ok.returncode == 0 and ok.stdout.strip() == "1"
    assert num.stdout.strip() == "1"
    assert jpeg.returncode == 0 and float(jpeg.stdout) > 0
    assert box.stdout.strip() == "1"


def test_rewards_score_errors(cli_runs):
    _, (bad, both) = cli_runs
    assert bad.returncode == 2 and "valid names: " in bad.stderr and "format" in bad.stderr and "Traceback" not in bad.stderr
    assert both.returncode == 2 and "--output" in both.stderr


def test_user_reward_file_is_called_during_training(cli_runs):
    tmp_path, (out,) = cli_runs
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert all("reward/small_numbers/mean" in r and "reward/match/mean" in r for r in rows)


def test_reward_failing_on_some_samples_keeps_training(cli_runs):
    tmp_path, (out,) = cli_runs
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert sum(r["reward/flaky/failed"] for r in rows) > 0
    assert "failed on" in out.stderr
