"""`mmrl train` on the tiny diffusion configs through a subprocess, one run per family, then a resume."""

import json
import os
import subprocess

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.integration]
CONTRACT = ["step", "reward/mean", "loss", "grad_norm", "clip_frac", "time/step_s"]
PREFIX = {"sd3": "transformer.", "sd": "unet.", "flux": "transformer.", "wan": "transformer."}
KL = {"sd3": True, "sd": True, "flux": False, "wan": True}  # kl_beta > 0 in sd3_tiny.yaml, sd_tiny.yaml, wan_tiny.yaml
REWARD = {"sd3": "jpeg_compressibility", "sd": "jpeg_compressibility", "flux": "jpeg_compressibility",
          "wan": "per_frame"}  # wan: the mean JPEG compressibility of a clip's frames
KINDS = ["sd3", "sd", "flux", "wan"]


@pytest.fixture(scope="module")
def train(mmrl_cmd, tiny_config):
    """`train(kind, out_dir, *overrides)`: `mmrl train` of the tiny config of `kind` as a subprocess."""

    def train(kind, out_dir, *overrides):
        cmd = mmrl_cmd("train", tiny_config(kind), f"output_dir={out_dir}", *overrides)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    return train


def rows(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def weights(out_dir, step):
    return load_file(os.path.join(out_dir, "checkpoints", f"step_{step:06d}", "policy.safetensors"))


def _run_and_resume(train, kind, out):
    """Two steps with a checkpoint after each, then a resume to step 3."""
    train(kind, out, "max_steps=2", "checkpoint.every=1", "eval.every=2")
    first = rows(out)
    w1, w2 = weights(out, 1), weights(out, 2)
    resumed = train(kind, out, "max_steps=3", "resume=auto", "checkpoint.every=1", "eval.every=2")
    return kind, out, first, (w1, w2), resumed


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train, in_background, selected_params):
    """{kind: Future of its run}: the runs and resumes of the families the selected tests use, started together
    (each subprocess keeps about one core busy)."""
    kinds = selected_params("run")
    return {kind: in_background(_run_and_resume, train, kind, tmp_path_factory.mktemp(f"{kind}_run"))
            for kind in KINDS if kind in kinds}


@pytest.fixture(scope="module", params=KINDS)
def run(request, runs):
    """Two steps with a checkpoint after each, then a resume to step 3: (kind, run directory, the first two
    steps' rows, the weights after steps 1 and 2, the resume's CompletedProcess). Every family's run is over
    before its tests start, so nothing runs beside the in-process and 2-process runs below."""
    done = {kind: job.result() for kind, job in runs.items()}
    return done[request.param]


def test_contract_metrics_logged(run):
    kind, _, first, _, _ = run
    train_rows = [r for r in first if "loss" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for r in train_rows:
        missing = [k for k in CONTRACT + [f"reward/{REWARD[kind]}/mean"] + (["kl"] if KL[kind] else [])
                   if r.get(k) is None]
        assert not missing, (kind, missing)
        assert r["ratio/first_max_abs_dev"] == 0.0  # on-policy ratio exactly 1 (fp32)


def test_eval_samples_written(run):
    kind, out, first, _, _ = run
    assert any("eval/reward/mean" in r for r in first if r["step"] == 0)
    for step in (0, 2):
        path = os.path.join(out, "samples", f"eval_step_{step:06d}.jsonl")
        with open(path) as f:
            samples = [json.loads(line) for line in f]
        assert len(samples) == 2
        suffix = ".gif" if kind == "wan" else ".png"
        for s in samples:
            assert s["output"].endswith(suffix) and os.path.isfile(os.path.join(out, "samples", s["output"]))
            assert s["scores"][REWARD[kind]] is not None
        grid = Image.open(os.path.join(out, "samples", f"eval_step_{step:06d}_grid.png"))
        one = Image.open(os.path.join(out, "samples", samples[0]["output"]))
        if kind == "wan":                                         # each clip a row of 8 of its 9 frames
            assert one.n_frames == 9 and grid.size == (8 * one.size[0], 2 * one.size[1])
        else:
            assert grid.size == (2 * one.size[0], one.size[1])    # the two eval images side by side


def test_lora_weights_change(run):
    kind, _, _, (w1, w2), _ = run
    assert w1 and all(k.startswith(PREFIX[kind]) and "lora" in k for k in w1)
    b = [k for k in w1 if "lora_B" in k]
    assert b and any(bool(w1[k].abs().sum() > 0) for k in b)  # B starts at 0: step 1 moved it
    assert any(not torch.equal(w1[k], w2[k]) for k in w1)


def test_resume_continues_from_the_checkpoint(run):
    kind, out, first, (_, w2), resumed = run
    assert "resumed from" in resumed.stderr and "at step 2" in resumed.stderr
    after = rows(out)
    assert [r["step"] for r in after if "loss" in r] == [1, 2, 3]
    assert [r for r in after if r["step"] <= 2] == first      # earlier rows kept as they were
    w3 = weights(out, 3)
    assert any(not torch.equal(w2[k], w3[k]) for k in w2)


@pytest.mark.parametrize("run", ["sd3"], indirect=True)
def test_resumed_step_equals_an_uninterrupted_run(run, tmp_path, tiny_config):
    """Step 3 after a resume is the step 3 of a straight 3-step run (weights, sampler, RNG restored)."""
    kind, out, _, _, _ = run
    from mmrl.config import load_config
    from mmrl.loop.trainer import train as train_in_process

    train_in_process(load_config(tiny_config(kind), [f"output_dir={tmp_path}", "max_steps=3", "eval.every=2",
                                                     "checkpoint.every=1", "logging.progress=false"]))
    straight = {r["step"]: r for r in rows(tmp_path)}[3]
    resumed = {r["step"]: r for r in rows(out)}[3]
    for key in ("reward/mean", "loss", "grad_norm"):
        assert straight[key] == pytest.approx(resumed[key], rel=1e-5, abs=1e-9), key
    torch.testing.assert_close(weights(tmp_path, 3), weights(out, 3))


@pytest.mark.parametrize("run", ["sd3"], indirect=True)
def test_two_processes_train_like_one(run, tmp_path, tiny_config, two_process_command):
    """accelerate launch with 2 CPU processes (gloo, DDP; several denoiser forwards per backward)."""
    _, out, first, (_, w2), _ = run
    cmd = two_process_command(tiny_config("sd3"), f"output_dir={tmp_path}", "max_steps=2", "eval.every=2",
                              "train.samples_per_microbatch=2")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    one = {r["step"]: r for r in first if "loss" in r}
    two = {r["step"]: r for r in rows(tmp_path) if "loss" in r}
    for step in (1, 2):
        assert two[step]["ratio/first_max_abs_dev"] == 0.0
        # the on-policy loss is a sum of advantages that cancel to ~0 (|A| ~ 1): its rounding noise
        # across a different process split is ~1e-7 absolute, so it gets an absolute tolerance
        for key, abs_tol in (("reward/mean", 1e-8), ("loss", 1e-6), ("grad_norm", 1e-8)):
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-4, abs=abs_tol), (step, key)
    torch.testing.assert_close(weights(tmp_path, 2), w2, rtol=1e-4, atol=1e-6)
