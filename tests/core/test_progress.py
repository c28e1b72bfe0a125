"""What a run prints: a short header instead of the whole config, a progress bar on a
terminal and periodic plain lines elsewhere, in every default and recipe."""

import dataclasses
import glob
import io
import os
from types import SimpleNamespace

from omegaconf import OmegaConf

from mmrl.reporting.console import Progress, header


class Terminal(io.StringIO):
    def isatty(self):
        return True


def _rows(total: int, eval_every: int):
    """The rows a run logs: the step-0 evaluation, then one row per step (eval merged in)."""
    yield {"step": 0, "eval/reward/mean": 0.125}
    for step in range(1, total + 1):
        row = {"step": step, "loss": 0.1, "reward/mean": step / total, "time/step_s": 0.5}
        if step % eval_every == 0 or step == total:
            row["eval/reward/mean"] = 0.5 + step / (2 * total)
        yield row


def test_plain_lines_every_tenth_of_the_run_and_at_the_end():
    out = io.StringIO()
    progress = Progress(25, 0, out)
    for row in _rows(25, eval_every=10):
        progress.update(row)
    progress.close()
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == [f"mmrl: step {s}/25" for s in [0, 1, *range(2, 25, 2), 25]]
    assert lines[0] == "mmrl: step 0/25 | eval reward 0.125 (step 0)"
    assert lines[6].startswith("mmrl: step 10/25 | reward 0.400 | eval reward 0.700 (step 10) | 0.50 s/step")
    assert lines[-1].startswith("mmrl: step 25/25 | reward 1.000 | eval reward 1.000 (step 25) | 0.50 s/step")
    assert "\r" not in out.getvalue()


def test_a_terminal_gets_a_bar_with_the_live_rewards():
    out = Terminal()
    progress = Progress(20, 0, out)
    for row in _rows(20, eval_every=10):
        progress.update(row)
    progress.close()
    text = out.getvalue()
    assert "\r" in text and "mmrl: step" not in text
    last = text.rsplit("\r", 1)[-1]
    assert "20/20" in last and "reward 1.000" in last and "eval reward 1.000 (step 20)" in last


def test_a_resumed_bar_starts_at_the_resumed_step():
    out = Terminal()
    progress = Progress(10, 6, out)
    progress.update({"step": 7, "loss": 0.0, "reward/mean": 0.5, "time/step_s": 0.1})
    progress.close()
    assert "7/10" in out.getvalue().rsplit("\r", 1)[-1]


def test_a_run_prints_a_header_and_progress_not_the_config(tmp_path, capsys, run_bandit):
    run_bandit(tmp_path, "max_steps=4", "eval.every=2")
    out, err = capsys.readouterr()
    assert out.startswith(f"mmrl: run {tmp_path} | policy bandit | 4 steps of 4 prompts x 8 samples | "
                          "held-out eval every 2 steps\n"
                          f"mmrl: config written to {tmp_path / 'config.yaml'}\n")
    assert "optim:" not in out and "max_steps: 4" in (tmp_path / "config.yaml").read_text()
    assert [line.split(" | ")[0] for line in err.splitlines() if line.startswith("mmrl: step")] == \
        [f"mmrl: step {s}/4" for s in range(5)]
    run_bandit(tmp_path / "quiet", "max_steps=2", "logging.progress=false")
    assert "mmrl: step" not in capsys.readouterr().err


def test_the_header_names_the_model_and_a_resumed_start(tmp_path, bandit_cfg):
    cfg = dataclasses.replace(bandit_cfg(tmp_path, "eval.every=0"), policy=SimpleNamespace(name="vlm", model="org/m"))
    assert header(cfg, 30).splitlines()[0] == (f"mmrl: run {tmp_path} | policy vlm (model org/m) | 40 steps "
                                               "(resuming after step 30) of 4 prompts x 8 samples | no eval")


def test_no_default_or_recipe_turns_progress_off(repo_root):
    paths = glob.glob(os.path.join(repo_root, "configs", "**", "*.yaml"), recursive=True)
    assert len(paths) > 10
    off = [p for p in paths if OmegaConf.select(OmegaConf.load(p), "logging.progress", default=True) is not True]
    assert off == []
