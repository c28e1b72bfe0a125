"""`mmrl report`: the page of a run directory (curves, tables, pictures), opened in a real headless browser
that must draw every figure; a running run's half-written line; the table per task and gold answer."""

import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image

from mmrl.reporting.report import render_report, write_report
from mmrl.reporting.samples import write_samples
from mmrl.reporting.summary import before_after, task_table
from rewards.sample import Sample, Video
from tests import REPO


def _clip(step: int, i: int) -> Video:
    """A 5-frame video: a white square moving right on black, blue from step 1 on."""
    colour = (255, 255, 255) if step == 0 else (0, 0, 255)
    frames = []
    for k in range(5):
        im = Image.new("RGB", (8, 8))
        im.paste(colour, (k, i % 4, k + 3, i % 4 + 3))
        frames.append(im)
    return Video(frames=frames, fps=4)


def _run_dir(tmp_path, images: bool = False, partial_line: bool = False, videos: bool = False):
    """A small run directory as the trainer leaves it: config, metrics of 4 steps, evaluations at 0 and 4."""
    (tmp_path / "config.yaml").write_text("seed: 3\nmax_steps: 4\npolicy: {name: vlm, model: m}\n"
                                          "algo: {advantage: grpo}\n")
    rows = [{"step": 0, "eval/reward/mean": 0.25, "eval/reward/a/mean": 0.2, "eval/reward/b/mean": 0.3,
             "eval/task/count/reward/mean": 0.0, "eval/task/colour/reward/mean": 0.5}]
    for step in range(1, 5):
        rows.append({"step": step, "reward/mean": step / 5, "reward/a/mean": step / 6, "reward/b/mean": step / 4,
                     "time/step_s": 1.5, "time/rollout_s": 1.0, "mem/peak_rss_bytes": 2 ** 30})
    rows[-1].update({"eval/reward/mean": 0.75, "eval/reward/a/mean": 0.7, "eval/reward/b/mean": 0.8,
                     "eval/task/count/reward/mean": 0.5, "eval/task/colour/reward/mean": 1.0})
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "metrics.jsonl").write_text(text[:-1] + '\n{"step": 5, "rew' if partial_line else text)
    (tmp_path / "samples").mkdir()
    for step, outputs in ((0, ["2", "2", "red", "red"]), (4, ["1", "2", "red", "blue"])):
        samples = [Sample(f"q{i}", _clip(step, i) if videos else
                          Image.new("RGB", (8, 8), (0, 0, 200 * (step > 0))) if images else o,
                          answer=["1", "2", "red", "blue"][i], meta={"task": ["count", "count", "colour", "colour"][i]})
                   for i, o in enumerate(outputs)]
        right = torch.tensor([[float(o == s.answer)] for o, s in zip(outputs, samples)])          # [4, 1]
        write_samples(str(tmp_path / "samples" / f"eval_step_{step:06d}.jsonl"), samples, right, ["a"],
                      totals=right[:, 0])
    before_after(str(tmp_path))
    return tmp_path


def test_report_of_a_text_run_has_every_part_and_the_browser_draws_every_figure(tmp_path, rendered_report):
    run = _run_dir(tmp_path)
    path = write_report(str(run))
    assert path == str(run / "report.html")
    page = open(path, encoding="utf-8").read()
    for part in ("status</td><td>finished: step 4 of 4", "Curves", "Evaluations", "eval/task/count/reward/mean",
                 "Held-out reward by task and gold answer", "Timings", "Memory", "config.yaml", "seed: 3"):
        assert part in page, part
    assert "http://" not in page and "https://" not in page            # self-contained: nothing to fetch
    figures, rendered, _ = rendered_report(run)
    # rewards, each reward (a and b), held-out by task, step time, memory
    assert figures == rendered == 5, (figures, rendered)


def test_report_of_an_image_run_shows_each_evaluations_grid_and_before_after(tmp_path, rendered_report):
    run = _run_dir(tmp_path, images=True)
    assert os.path.isfile(run / "samples" / "eval_step_000004_grid.png") and os.path.isfile(run / "before_after.png")
    page = open(write_report(str(run)), encoding="utf-8").read()
    assert "step 0: held-out images" in page and "step 4: held-out images" in page and "Before and after" in page
    assert "Held-out reward by task and gold answer" not in page        # the answers table is for text outputs
    figures, rendered, _ = rendered_report(run)
    assert figures == rendered == 8, (figures, rendered)                  # 5 curves + 2 grids + before/after


def test_report_of_a_video_run_plays_the_first_and_last_held_out_videos(tmp_path, rendered_report):
    """Video outputs: GIFs beside the JSONL, a frame strip per clip in each grid (so before/after compares strips),
    and the page plays the first and the last evaluation's clips (animated GIFs the browser must draw)."""
    run = _run_dir(tmp_path, videos=True)
    rows = [json.loads(line) for line in open(run / "samples" / "eval_step_000004.jsonl")]
    assert [r["output"] for r in rows] == [f"eval_step_000004/{i:04d}.gif" for i in range(4)]
    with Image.open(run / "samples" / rows[1]["output"]) as gif:
        assert (gif.n_frames, gif.size, gif.info["duration"], gif.info["loop"]) == (5, (8, 8), 250, 0)
        gif.seek(4)
        assert gif.convert("RGB").getpixel((5, 2)) == (0, 0, 255)       # the last frame: the square moved right
    grid = Image.open(run / "samples" / "eval_step_000004_grid.png").convert("RGB")
    assert grid.size == (5 * 8, 4 * 8)                                  # a row per clip, a column per frame
    assert grid.getpixel((0, 8 + 1)) == (0, 0, 255) and grid.getpixel((4 * 8 + 4, 8 + 1)) == (0, 0, 255)
    page = open(write_report(str(run)), encoding="utf-8").read()
    assert page.count("data:image/gif;base64,") == 8 and "Held-out videos" in page and "step 4: q3" in page
    assert "Held-out reward by task and gold answer" not in page        # GIF paths are no text answers
    figures, rendered, _ = rendered_report(run)
    assert figures == rendered == 16, (figures, rendered)                # 5 curves, 2 grids, before/after, 8 clips


def test_a_clip_is_also_an_mp4_where_imageio_can_encode_it(tmp_path):
    """With the video extra (imageio + imageio-ffmpeg, in the test extra): an H.264 MP4 of every frame at the
    clip's fps beside the GIF."""
    imageio = pytest.importorskip("imageio")
    pytest.importorskip("imageio_ffmpeg")
    import numpy as np

    from mmrl.reporting.samples import write_video

    paths = write_video(str(tmp_path / "clip"), _clip(1, 0))
    assert paths == [str(tmp_path / "clip.gif"), str(tmp_path / "clip.mp4")]
    reader = imageio.get_reader(paths[1])
    meta, frames = reader.get_meta_data(), [np.asarray(f) for f in reader]
    assert (meta["codec"], meta["fps"], meta["size"], len(frames)) == ("h264", 4.0, (8, 8), 5)
    assert frames[4][1, 5, 2] > 200 and frames[0][1, 5, 2] < 50           # the square moved right (lossy: ranges)


def test_a_figure_that_does_not_decode_is_caught_by_the_page_check(tmp_path, rendered_report):
    run = _run_dir(tmp_path)
    page = (run / "report.html")
    page.write_text(render_report(str(run)).replace("data:image/png;base64,iVBOR", "data:image/png;base64,AAAA", 1))
    figures, rendered, dom = rendered_report(run)
    assert (figures, rendered) == (5, 4)
    assert "1 of 5 figures did not render" in dom


def test_report_of_a_running_run_skips_the_line_being_written(tmp_path):
    run = _run_dir(tmp_path, partial_line=True)
    (run / "config.yaml").write_text("max_steps: 100\n")
    page = render_report(str(run))
    assert "step 4 of 100 (running, stopped or interrupted)" in page


def test_task_table_shows_a_constant_answer_per_gold():
    """Answering "2" to everything: right on gold 2 only, which the per-gold rows show."""
    before = [{"task": "count", "answer": g, "output": "2", "reward": float(g == "2")} for g in "0123"]
    after = [{"task": "count", "answer": g, "output": g, "reward": 1.0} for g in "0123"]
    table = task_table(before, after)
    assert table[0] == ["count", "(all)", "4", "0.250", "1.000", "2 (100%)", "0 (25%)"]
    assert [row[1:5] for row in table[1:]] == [["0", "1", "0.000", "1.000"], ["1", "1", "0.000", "1.000"],
                                               ["2", "1", "1.000", "1.000"], ["3", "1", "0.000", "1.000"]]


def test_before_after_md_leads_with_the_reward_by_task_and_gold(tmp_path):
    run = _run_dir(tmp_path)
    text = (run / "before_after.md").read_text()
    assert "| count | (all) | 2 | 0.500 | 1.000 | 2 (100%) | 1 (50%) |" in text
    assert "| colour | blue | 1 | 0.000 | 1.000 | red (100%) | blue (100%) |" in text
    assert text.index("Reward by task and gold answer") < text.index("Every answer")


@pytest.mark.integration
def test_cli_report_writes_the_page_and_names_a_directory_that_is_not_a_run(tmp_path, in_background):
    run = _run_dir(tmp_path / "run") if (tmp_path / "run").mkdir() is None else None
    out = tmp_path / "elsewhere.html"
    written, refused = (in_background(subprocess.run, [sys.executable, "-m", "mmrl", "report", *args], cwd=REPO,
                                      capture_output=True, text=True, timeout=120)             # side by side
                        for args in ([str(run), "--out", str(out)], [str(tmp_path / "nothing")]))
    done = written.result()
    assert done.returncode == 0 and out.is_file() and "report written to" in done.stdout, done.stderr
    done = refused.result()
    assert done.returncode == 2 and "nothing" in done.stderr and "metrics.jsonl" in done.stderr, done.stderr


def test_a_run_that_logged_nothing_ends_cleanly_without_a_report(tmp_path, bandit_config):
    from mmrl.config import load_config
    from mmrl.loop.trainer import train

    train(load_config(bandit_config, [f"output_dir={tmp_path}", "max_steps=0", "eval.every=0"]))
    assert (tmp_path / "config.yaml").is_file() and not (tmp_path / "report.html").exists()
    train(load_config(bandit_config, [f"output_dir={tmp_path / 'b'}", "max_steps=2"]))
    assert (tmp_path / "b" / "report.html").is_file()
