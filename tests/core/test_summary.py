"""End-of-run artifacts: summary text, reward curve, before/after comparison."""

import json

from PIL import Image

from mmrl.reporting.samples import write_samples
from mmrl.reporting.summary import before_after, plot_rewards, summary_text
from rewards.sample import Sample
import torch


def test_summary_text_reports_first_and_last():
    rows = [{"step": 0, "eval/reward/mean": 0.1}] + [{"step": i, "reward/mean": i / 10} for i in range(1, 9)] \
        + [{"step": 8, "eval/reward/mean": 0.7}]
    text = summary_text(rows)
    assert "train reward 0.150 -> 0.750" in text and "eval reward 0.100 (step 0) -> 0.700 (step 8)" in text


def test_reward_curve_png(tmp_path):
    path = plot_rewards(str(tmp_path), [{"step": 0, "eval/reward/mean": 0.1}, {"step": 1, "reward/mean": 0.2}])
    assert Image.open(path).size[0] > 100
    assert plot_rewards(str(tmp_path), [{"step": 1}]) is None


def _eval(tmp_path, step, outputs):
    (tmp_path / "samples").mkdir(exist_ok=True)
    samples = [Sample(f"p{i}", o, answer="a") for i, o in enumerate(outputs)]
    write_samples(str(tmp_path / "samples" / f"eval_step_{step:06d}.jsonl"), samples,
                  torch.tensor([[0.0], [1.0]]), ["r"])


def test_before_after_table_for_text(tmp_path):
    _eval(tmp_path, 0, ["x", "y|z"])
    _eval(tmp_path, 10, ["a", "b"])
    text = open(before_after(str(tmp_path))).read()
    assert "| p1 | a | y\\|z | {'r': 1.0} | b | {'r': 1.0} |" in text


def test_before_after_grid_for_images(tmp_path):
    red, blue = Image.new("RGB", (8, 8), (255, 0, 0)), Image.new("RGB", (8, 8), (0, 0, 255))
    _eval(tmp_path, 0, [red, red])
    _eval(tmp_path, 4, [blue, blue])
    out = Image.open(before_after(str(tmp_path)))
    w, h = out.size
    assert out.getpixel((5, 20)) == (255, 0, 0) and out.getpixel((5, h - 5)) == (0, 0, 255)
    assert json.loads(open(tmp_path / "samples" / "eval_step_000000.jsonl").readline())["output"].endswith(".png")
