"""`mmrl rewards list|score` and a user reward file used by `mmrl train`."""

import json

import pytest
from PIL import Image

pytestmark = pytest.mark.integration


def test_rewards_list_prints_one_line_per_reward(cli):
    out = cli("rewards", "list")
    assert out.returncode == 0
    names = [line.split()[0] for line in out.stdout.splitlines()]
    for name in ("format", "math", "iou", "clip_score", "jpeg_compressibility"):
        assert name in names


def test_rewards_score_text_and_image(tmp_path, cli):
    ok = cli("rewards", "score", "format", "--output", "<think>a</think><answer>b</answer>")
    assert ok.returncode == 0 and ok.stdout.strip() == "1"
    num = cli("rewards", "score", "numeric", "--output", "<answer>3.0</answer>", "--answer", "3")
    assert num.stdout.strip() == "1"
    img = tmp_path / "flat.png"
    Image.new("RGB", (32, 32), (128, 128, 128)).save(img)
    jpeg = cli("rewards", "score", "jpeg_incompressibility", "--output-image", str(img))
    assert jpeg.returncode == 0 and float(jpeg.stdout) > 0
    box = cli("rewards", "score", "iou", "--output", "[0, 0, 10, 10]", "--answer", "[0, 0, 20, 20]",
              "--meta", json.dumps({"resize": [{"original_size": [200, 200], "model_size": [100, 100]}]}))
    assert box.stdout.strip() == "1"


def test_rewards_score_errors(cli):
    bad = cli("rewards", "score", "nope", "--output", "x")
    assert bad.returncode == 2 and "valid names: " in bad.stderr and "format" in bad.stderr and "Traceback" not in bad.stderr
    both = cli("rewards", "score", "format")
    assert both.returncode == 2 and "--output" in both.stderr


def test_user_reward_file_is_called_during_training(tmp_path, bandit_config, repo_root, cli):
    reward = f"{repo_root}/examples/my_reward.py:small_numbers"
    out = cli("train", bandit_config, f"output_dir={tmp_path}", "max_steps=3", "eval.every=0",
              f"rewards=[{{name: '{reward}', scale: 8}}, {{name: 'mmrl.testing.bandit:match', label: match}}]")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert all("reward/small_numbers/mean" in r and "reward/match/mean" in r for r in rows)


def test_reward_failing_on_some_samples_keeps_training(tmp_path, bandit_config, cli):
    flaky = tmp_path / "flaky.py"
    flaky.write_text("def flaky(samples):\n"
                     "    if any(s.output.startswith('7') for s in samples) and len(samples) == 1:\n"
                     "        raise RuntimeError('seven')\n"
                     "    if len(samples) > 1 and any(s.output.startswith('7') for s in samples):\n"
                     "        raise RuntimeError('batch has a seven')\n"
                     "    return [1.0] * len(samples)\n")
    out = cli("train", bandit_config, f"output_dir={tmp_path / 'run'}", "max_steps=3", "eval.every=0",
              f"rewards=[{{name: '{flaky}:flaky'}}]")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert sum(r["reward/flaky/failed"] for r in rows) > 0
    assert "failed on" in out.stderr
