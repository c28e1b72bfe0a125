"""The agent CPU default (configs/tiny/agent_frozenlake.yaml): the committed pretrained agent loads offline
and rarely reaches the goal greedily, a shortened run of the default raises its held-out success, and the
pretraining script writes a loadable model.

The shortened default trains in process on one thread (policy.cpu_threads 1); the module's two other runs
(the committed agent's evaluation through the CLI and the pretraining script) are subprocesses started
before it, so they run beside it on the other core."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "configs", "tiny", "agent_frozenlake.yaml")
MODEL = os.path.join(ROOT, "assets", "tiny", "frozenlake_agent")
SHORT_STEPS = 8           # the shortened default (the full one trains 40 steps)
# eval/reward/mean(step 8) - (step 0) on 32 held-out maps: measured +0.69, +0.75, +0.72 for seeds 0-2 (at 6 steps
# seed 0 rose only +0.37; at 10 steps +0.70 to +0.97 on 64 maps)
SHORT_MARGIN = 0.25


@pytest.fixture(scope="module")
def side_runs(tmp_path_factory, mmrl_cmd, side_runs_of):
    """The committed agent evaluated at step 0 (`mmrl train ... max_steps=0`), then the pretraining script (those
    whose test is selected), one after the other beside the in-process run (`side_runs_of`)."""
    committed, pretrained = tmp_path_factory.mktemp("committed"), tmp_path_factory.mktemp("pretrained") / "model"
    return side_runs_of({
        "committed": ("test_committed_agent_loads_offline_and_rarely_reaches_the_goal_greedily", committed,
                      mmrl_cmd("train", CONFIG, f"output_dir={committed}", "max_steps=0", "eval.every=1")),
        "pretrained": ("test_pretraining_script_writes_a_loadable_model", pretrained,
                       [sys.executable, "-m", "shapes_world.pretrain_agent", "--seed", "0", "--out", str(pretrained),
                        "--iters", "2", "--bias-iters", "1", "--batch", "4", "--val", "8", "--episodes", "2",
                        "--log-every", "2"]),
    })


@pytest.mark.slow
@pytest.mark.integration
def test_shortened_default_raises_the_held_out_success_and_reports_it(tmp_path, eval_curve_of, rendered_report,
                                                                     side_runs):
    """First in the module: `side_runs` starts the other tests' subprocesses before this one trains."""
    curve = eval_curve_of(CONFIG, tmp_path, f"max_steps={SHORT_STEPS}", f"eval.every={SHORT_STEPS}",
                          "eval.max_prompts=32", "eval.prompts_per_batch=32")
    (first_step, first), (last_step, last) = curve[0], curve[-1]
    assert (first_step, last_step) == (0, SHORT_STEPS), curve
    assert last - first >= SHORT_MARGIN, f"held-out success {first:.3f} -> {last:.3f} (want +{SHORT_MARGIN})"
    figures, rendered, dom = rendered_report(tmp_path)       # the report the run wrote, in a headless browser
    assert figures == rendered >= 6, (figures, rendered)      # curves, timings, memory, 2 strips, before/after
    assert f"step {SHORT_STEPS}: first held-out episode" in dom and "eval/success" in dom


@pytest.mark.integration
def test_committed_agent_loads_offline_and_rarely_reaches_the_goal_greedily(side_runs, side_run_curve):
    assert os.path.isfile(os.path.join(MODEL, "model.safetensors")), "assets/tiny/frozenlake_agent is missing"
    curve = side_run_curve(side_runs["committed"], "committed")
    assert curve and curve[0][0] == 0, curve
    assert curve[0][1] <= 0.1, f"pretrained held-out greedy success {curve[0][1]} above 0.1"


@pytest.mark.integration
def test_pretraining_script_writes_a_loadable_model(side_runs):
    out, job = side_runs["pretrained"]
    done = job.result()["pretrained"]
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"iter": 2' in done.stdout and '"held_out_episodes"' in done.stdout, done.stdout
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(str(out))
    processor = AutoProcessor.from_pretrained(str(out))
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert processor.tokenizer.tokenize("<answer>left</answer>") == ["<answer>", "left", "</answer>"]
