"""CLI smoke test of the tiny VLM config through a subprocess: train, validate, checkpoint, resume; and a
2-process run, started with the module's first test so that it runs beside the 1-process runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "tiny", "vlm_tiny.yaml")
CONTRACT = ("step", "reward/mean", "reward/format/mean", "reward/numeric/mean", "loss", "grad_norm",
            "clip_frac", "time/step_s")


def _train(out_dir: str, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mmrl", "train", CONFIG, f"output_dir={out_dir}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", autouse=True)
def gloo_run(tmp_path_factory, in_background, selected):
    """(output directory, Future of the CompletedProcess) of the 2-process run when its test is selected."""
    if "test_two_process_gloo_run" not in selected:
        return None
    out = str(tmp_path_factory.mktemp("gloo") / "ddp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "mmrl",
           "train", CONFIG, f"output_dir={out}", "max_steps=1", "eval.every=0"]
    return out, in_background(subprocess.run, cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _metrics(out_dir: str) -> list[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
@pytest.mark.integration
def test_tiny_vlm_trains_validates_and_resumes(tmp_path):
    out = str(tmp_path / "run")
    first = _train(out, "max_steps=2", "checkpoint.every=1", "eval.every=2")
    assert first.returncode == 0, first.stderr[-3000:]
    rows = _metrics(out)
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for r in train_rows:
        missing = [k for k in CONTRACT if k not in r]
        assert not missing, f"metrics lack {missing}"
        assert r["ratio/first_max_abs_dev"] == 0.0          # one predict forward for rollout and training
    # the weights changed: LoRA B starts at zero, so a trained adapter has non-zero B matrices
    ckpt = os.path.join(out, "checkpoints", "step_000002", "policy.safetensors")
    weights = load_file(ckpt)
    assert any("lora_B" in k for k in weights)
    assert max(float(v.abs().max()) for k, v in weights.items() if "lora_B" in k) > 0
    # validation samples: prompts, greedy completions and scores
    with open(os.path.join(out, "samples", "eval_step_000002.jsonl")) as f:
        evals = [json.loads(line) for line in f]
    assert evals and all(isinstance(e["output"], str) and e["prompt"] and "numeric" in e["scores"] for e in evals)

    second = _train(out, "max_steps=3", "checkpoint.every=1", "eval.every=2", "resume=auto")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr
    steps = [r["step"] for r in _metrics(out) if "loss" in r]
    assert steps == [1, 2, 3]
    assert os.path.isdir(os.path.join(out, "checkpoints", "step_000003"))


def test_bad_policy_key_is_a_config_error(tmp_path):
    from mmrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="policy.temprature|temprature"):
        load_config(CONFIG, ["policy.temprature=0.5"])


@pytest.mark.slow
@pytest.mark.integration
def test_two_process_gloo_run(gloo_run):
    """DDP on CPU (gloo): each process rolls out its own prompts; the prepared TokenScorer syncs grads."""
    out, job = gloo_run
    done = job.result()
    assert done.returncode == 0, done.stderr[-3000:]
    row = _metrics(out)[-1]
    assert row["step"] == 1 and row["ratio/first_max_abs_dev"] == 0.0 and row["filter/kept_groups"] == 1
