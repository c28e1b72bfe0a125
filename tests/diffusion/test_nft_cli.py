"""`mmrl train` of the tiny SD3 smoke config with algo.objective=nft (DiffusionNFT) through a subprocess:
finite losses and the nft metrics, the old policy in each checkpoint, and a resume that is bit-exact."""

import json
import math
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file

pytestmark = [pytest.mark.slow, pytest.mark.integration]
NFT = ["algo.objective=nft", "algo.nft.timesteps=2", "algo.nft.old_decay_rate=0.25", "checkpoint.every=1",
       "eval.every=2"]                                     # decay 0.25 per step: old and theta differ visibly
KEYS = ["reward/mean", "loss", "grad_norm", "nft/loss_pos", "nft/loss_neg", "nft/old_deviate", "nft/r_mean",
        "nft/old_decay", "kl"]                             # kl: sd3_tiny.yaml has kl_beta 0.04 (LoRA off = reference)


@pytest.fixture(scope="module")
def train(mmrl_cmd, tiny_config):
    """`train(out_dir, *overrides)`: `mmrl train` of the tiny SD3 config with NFT as a subprocess."""

    def train(out_dir, *overrides):
        cmd = mmrl_cmd("train", tiny_config("sd3"), f"output_dir={out_dir}", *NFT, *overrides)
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        return result

    return train


def rows(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if "loss" in r}


def checkpoint(out_dir, step, name):
    return load_file(os.path.join(out_dir, "checkpoints", f"step_{step:06d}", name))


def _run_and_resume(train, out):
    """Two steps with a checkpoint after each, then a resume to step 3."""
    train(out, "max_steps=2")
    first = rows(out)
    result = train(out, "max_steps=3", "resume=auto")
    return out, first, result


def _uninterrupted(train, out):
    """Three steps without a stop; returns the run directory."""
    train(out, "max_steps=3")
    return out


def _two_processes(cmd, out):
    """(the run directory, the CompletedProcess) of the 2-process command `cmd` writing to `out`."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return out, subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train, tiny_config, two_process_command, in_background, selected):
    """{name: Future}: the module's runs, started together (each process keeps about one core busy): the run
    resumed at step 2 (two subprocesses, one after the other) and, where their tests are selected, the
    uninterrupted 3-step run (its directory) and the 2-process run of two steps (its directory, CompletedProcess)."""
    jobs = {"resumed": in_background(_run_and_resume, train, tmp_path_factory.mktemp("nft_run"))}
    if "test_resumed_step_is_bit_exact_with_an_uninterrupted_run" in selected:
        jobs["straight"] = in_background(_uninterrupted, train, tmp_path_factory.mktemp("nft_straight"))
    if "test_two_processes_train_like_one" in selected:
        two = tmp_path_factory.mktemp("nft_two")
        cmd = two_process_command(tiny_config("sd3"), f"output_dir={two}", "max_steps=2",
                                  "train.samples_per_microbatch=2", *NFT)
        jobs["two"] = in_background(_two_processes, cmd, two)
    return jobs


@pytest.fixture(scope="module")
def resumed(runs):
    """Two steps with a checkpoint after each, then a resume to step 3."""
    return runs["resumed"].result()


def test_losses_are_finite_and_the_nft_metrics_logged(resumed):
    _, first, _ = resumed
    assert sorted(first) == [1, 2]
    for step, r in first.items():
        missing = [k for k in KEYS if r.get(k) is None]
        assert not missing, (step, missing)
        assert all(math.isfinite(r[k]) for k in KEYS) and r["loss"] > 0
        assert "clip_frac" not in r and "ratio/first_max_abs_dev" not in r   # no policy-gradient metrics
    assert first[1]["nft/old_deviate"] == 0.0                  # old == theta in the first step (a copy of the start)
    assert first[1]["nft/old_decay"] == 0.25 and first[2]["nft/old_decay"] == 0.5


def test_each_checkpoint_holds_the_old_policy(resumed):
    out, _, _ = resumed
    policy, old = checkpoint(out, 2, "policy.safetensors"), checkpoint(out, 2, "policy.nft_old.safetensors")
    lora = {k.split(".", 1)[1].replace(".weight", ".default.weight"): v for k, v in policy.items()}
    assert sorted(old) == sorted(lora)                         # the LoRA's weights, by parameter name
    assert any(not torch.equal(old[k], lora[k]) for k in old)  # decay 0.5: old lags theta


def test_resumed_step_is_bit_exact_with_an_uninterrupted_run(resumed, runs):
    out, _, result = resumed
    assert "resumed from" in result.stderr and "at step 2" in result.stderr
    uninterrupted = runs["straight"].result()
    straight, again = rows(uninterrupted)[3], rows(out)[3]
    for key in KEYS:
        assert straight[key] == again[key], key
    for name in ("policy.safetensors", "policy.nft_old.safetensors"):
        a, b = checkpoint(uninterrupted, 3, name), checkpoint(out, 3, name)
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), name


def test_two_processes_train_like_one(resumed, runs):
    """accelerate launch with 2 CPU processes (gloo, DDP): same steps, same weights and old weights, up to
    the rounding of a different split (the old forwards swap weights in place under the DDP wrapper)."""
    out, first, _ = resumed
    two_dir, result = runs["two"].result()
    assert result.returncode == 0, result.stderr[-3000:]
    two = rows(two_dir)
    for step in (1, 2):
        for key in ("reward/mean", "loss", "grad_norm", "kl"):
            assert two[step][key] == pytest.approx(first[step][key], rel=1e-4, abs=1e-8), (step, key)
    for name in ("policy.safetensors", "policy.nft_old.safetensors"):
        a, b = checkpoint(two_dir, 2, name), checkpoint(out, 2, name)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
