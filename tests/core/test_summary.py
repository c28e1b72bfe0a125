"""End-of-run artifacts: summary text, reward curve, before/after comparison."""

import json

from PIL import Image

from mmrl.reporting.samples import write_samples
from mmrl.reporting.summary import before_after, plot_rewards, summary_text
from rewards.sample import Sample, Video
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


def _shades(line: list) -> list:
    """The runs of saturated pixels along a line of pixels (white, the grey between frames and the caption's
    grey-scale text separate them), one shade per run."""
    runs, prev = [], None
    for px in line:
        shade = px if max(px) - min(px) > 50 else None
        if shade is not None and shade != prev:
            runs.append(shade)
        prev = shade
    return runs


def test_before_after_of_videos_puts_each_clips_strips_side_by_side(tmp_path):
    """Videos: one row per held-out clip (at most VIDEO_PAIRS_SHOWN), its frames before on the left and after on the
    right, in order and apart (each frame a solid shade: the runs of shades along a row are the frames)."""
    from mmrl.reporting.summary import VIDEO_PAIRS_SHOWN

    def clips(step, n):
        shade = (lambda k: (250 - 60 * k, 0, 0)) if step == 0 else (lambda k: (0, 0, 250 - 60 * k))
        return [Video([Image.new("RGB", (8, 8), shade(k)) for k in range(3)], fps=4) for _ in range(n)]

    n = VIDEO_PAIRS_SHOWN + 4
    (tmp_path / "samples").mkdir()
    for step in (0, 6):
        samples = [Sample(f"p{i}", v) for i, v in enumerate(clips(step, n))]
        write_samples(str(tmp_path / "samples" / f"eval_step_{step:06d}.jsonl"), samples, torch.zeros(n, 1), ["r"],
                      totals=torch.full((n,), 0.5))
    out = Image.open(before_after(str(tmp_path))).convert("RGB")
    px = out.load()
    reds = [x for x in range(out.width) if any(px[x, y][0] > 100 and px[x, y][2] == 0 for y in range(out.height))]
    blues = [x for x in range(out.width) if any(px[x, y][2] > 100 and px[x, y][0] == 0 for y in range(out.height))]
    assert reds and blues and max(reds) < min(blues)                     # before on the left, after on the right
    column = [px[reds[0] + 1, y] for y in range(out.height)]
    assert len(_shades(column)) == VIDEO_PAIRS_SHOWN                       # a row per clip, capped
    y = next(y for y in range(out.height) if px[reds[0] + 1, y] == (250, 0, 0))
    assert _shades([px[x, y] for x in range(out.width)]) == \
        [(250, 0, 0), (190, 0, 0), (130, 0, 0), (0, 0, 250), (0, 0, 190), (0, 0, 130)]
    row = [px[x, y] for x in range(out.width)]
    end, start = max(x for x, p in enumerate(row) if p == (250, 0, 0)), row.index((190, 0, 0))
    assert (150, 150, 150) in row[end:start]                              # frames apart, a grey line between
