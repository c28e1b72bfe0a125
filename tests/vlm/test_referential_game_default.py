"""The multi-agent CPU default (configs/tiny/referential_game.yaml): the committed speaker and listener load offline
and start near chance with vague messages, a shortened run of the default raises the team's held-out success as the
speaker's messages come to name the target, and the pretraining script writes two loadable models.

The shortened default trains in process on one thread (cpu_threads 1 for both policies); the module's two other
runs (the committed team's evaluation through the CLI and the pretraining script) are subprocesses started before
it, so they run beside it on the other core."""

from __future__ import annotations

import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "configs", "tiny", "referential_game.yaml")
MODELS = [os.path.join(ROOT, "assets", "tiny", name) for name in ("referential_speaker", "referential_listener")]
SHORT_STEPS = 6           # the shortened default (the full one trains 40 steps)
# eval/success(step 6) - (step 0) on 64 held-out rounds: measured 0.188 -> 1.000 for seeds 0, 1 and 2; the full
# default's rose by +0.72 to +0.78 by step 10 on 128 rounds, seeds 0-3 (docs/guides/multi-agent.md)
SHORT_MARGIN = 0.5


def colour_named(sample) -> bool:
    """Whether a speaker's message names its target's colour."""
    from shapes_world.referential import sample_round

    shapes, target = sample_round(sample["seed"])
    return shapes[target].color in sample["output"].split()


def speaker_messages(run_dir, step: int) -> list[dict]:
    with open(os.path.join(run_dir, "samples", f"eval_step_{step:06d}.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    out = []
    for r in rows:
        if " role speaker " in r["id"]:
            out.append({"seed": int(r["id"].split("env seed ")[1].split()[0]), "output": r["output"]})
    return out


@pytest.fixture(scope="module")
def side_runs(tmp_path_factory, mmrl_cmd, side_runs_of):
    """The committed team evaluated at step 0 (`mmrl train ... max_steps=0`), then the pretraining script (those
    whose test is selected), one after the other beside the in-process run (`side_runs_of`)."""
    committed, pretrained = tmp_path_factory.mktemp("committed"), tmp_path_factory.mktemp("pretrained")
    return side_runs_of({
        "committed": ("test_committed_team_loads_offline_and_starts_near_chance", committed,
                      mmrl_cmd("train", CONFIG, f"output_dir={committed}", "max_steps=0", "eval.every=1")),
        "pretrained": ("test_pretraining_script_writes_two_loadable_models", pretrained,
                       [sys.executable, "-m", "shapes_world.pretrain_referential", "--seed", "0", "--out",
                        str(pretrained), "--see-iters", "2", "--iters", "2", "--vague-iters", "1", "--batch", "4", "--episodes", "2",
                        "--log-every", "2"]),
    })


@pytest.mark.slow
@pytest.mark.integration
def test_shortened_default_raises_team_success_with_descriptive_messages(tmp_path, eval_curve_of, side_runs):
    """First in the module: `side_runs` starts the other tests' subprocesses before this one trains."""
    curve = eval_curve_of(CONFIG, tmp_path, f"max_steps={SHORT_STEPS}", f"eval.every={SHORT_STEPS}",
                          "eval.max_prompts=64", "eval.prompts_per_batch=64")
    (first_step, first), (last_step, last) = curve[0], curve[-1]
    assert (first_step, last_step) == (0, SHORT_STEPS), curve
    assert last - first >= SHORT_MARGIN, f"held-out success {first:.3f} -> {last:.3f} (want +{SHORT_MARGIN})"
    before, after = (speaker_messages(tmp_path, s) for s in (0, SHORT_STEPS))
    named = [sum(map(colour_named, m)) / len(m) for m in (before, after)]
    assert named[1] - named[0] >= 0.5, named                  # the rise is the speaker naming the target's colour


@pytest.mark.integration
def test_committed_team_loads_offline_and_starts_near_chance(side_runs, side_run_curve):
    for folder in MODELS:
        assert os.path.isfile(os.path.join(folder, "model.safetensors")), f"{folder} is missing"
    out, _ = side_runs["committed"]
    curve = side_run_curve(side_runs["committed"], "committed")
    assert curve and curve[0][0] == 0, curve
    assert curve[0][1] <= 0.4, f"pretrained held-out greedy success {curve[0][1]} above 0.4 (chance: 0.25)"
    messages = speaker_messages(out, 0)
    assert sum(map(colour_named, messages)) / len(messages) <= 0.2, messages[:8]


@pytest.mark.integration
def test_pretraining_script_writes_two_loadable_models(side_runs):
    out, job = side_runs["pretrained"]
    done = job.result()["pretrained"]
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"iter": 2' in done.stdout and '"held_out"' in done.stdout, done.stdout
    from transformers import AutoModelForImageTextToText, AutoProcessor

    for name in ("referential_speaker", "referential_listener"):
        model = AutoModelForImageTextToText.from_pretrained(str(out / name))
        processor = AutoProcessor.from_pretrained(str(out / name))
        assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
        assert processor.tokenizer.tokenize("<answer>3</answer>") == ["<answer>", "3", "</answer>"]
