"""Two distinct policies trained together through the CLI (configs/tiny/team_tiny.yaml: a tiny Qwen2.5-VL speaker
with LoRA and a tiny LLaVA listener trained in full, each with its own learning rate): the run resumes bit-exactly
after SIGKILL, with both policies' weights, optimizers and schedulers, and each policy exports on its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch

from tests import REPO

pytestmark = [pytest.mark.slow, pytest.mark.integration]
TEAM = os.path.join(REPO, "configs", "tiny", "team_tiny.yaml")
REWARD = os.path.join(REPO, "tests", "vlm", "team_reward.py") + ":distinct_letters"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def latest(run: str) -> int:
    try:
        with open(os.path.join(run, "checkpoints", "latest")) as f:
            return int(f.read().strip().split("_")[1])
    except (FileNotFoundError, ValueError, IndexError):
        return 0


def test_two_policies_train_resume_after_sigkill_and_export_separately(tmp_path, mmrl_cmd, read_metrics,
                                                                        comparable_rows):
    common = [TEAM, "max_steps=4", "checkpoint.every=2", "eval.every=2", f"rewards=[{{name: '{REWARD}'}}]",
              "policy.old_log_probs=rollout", "policies.listener.policy.old_log_probs=rollout",
              "policy.max_new_tokens=12", "logging.save_samples_every=2"]
    full, broken = str(tmp_path / "full"), str(tmp_path / "broken")
    unbroken = subprocess.Popen(mmrl_cmd("train", *common, f"output_dir={full}"), cwd=REPO, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(mmrl_cmd("train", *common, f"output_dir={broken}"), cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while latest(broken) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 2 <= latest(broken) < 4
    _, err = unbroken.communicate(timeout=600)                        # reads stderr: a full pipe never stalls it
    assert unbroken.returncode == 0, err[-3000:]
    rows = read_metrics(full)
    trained = [r for r in rows if "policy/loss" in r]
    assert [r["step"] for r in trained] == list(range(1, 5))
    for name in ("policy", "listener"):                      # both changed, so resuming either could go wrong
        assert any(r[f"{name}/grad_norm"] > 0 for r in trained), name
        assert all(r[f"{name}/ratio/first_max_abs_dev"] == 0.0 for r in trained), name
    assert {r["policy/optim/lr"] for r in trained} == {1e-3} and {r["listener/optim/lr"] for r in trained} == {1e-4}
    assert "eval/success" in rows[0] and "eval/reward/mean" in trained[-1]
    with open(os.path.join(full, "samples", "step_000002.jsonl")) as f:
        roles = [json.loads(line)["id"].split(" role ")[1].split()[0] for line in f]
    assert roles == ["speaker"] * 8 + ["listener"] * 8
    ckpt = os.path.join(full, "checkpoints", "step_000004")
    assert sorted(os.listdir(os.path.join(ckpt, "policies", "listener"))) == ["optimizer.pt", "policy.safetensors",
                                                                                "scheduler.pt"]

    again = subprocess.run(mmrl_cmd("train", *common, f"output_dir={broken}", "resume=auto"), cwd=REPO, env=ENV,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert comparable_rows(broken) == comparable_rows(full)

    from safetensors.torch import load_file

    for name in ("policy", "listener"):
        a = load_file(os.path.join(ckpt, *(["policies", name] if name != "policy" else []), "policy.safetensors"))
        b = load_file(os.path.join(broken, "checkpoints", "step_000004",
                                   *(["policies", name] if name != "policy" else []), "policy.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

    listener, speaker = str(tmp_path / "listener"), str(tmp_path / "speaker")
    for out, extra in ((listener, ["--policy", "listener"]), (speaker, [])):
        done = subprocess.run(mmrl_cmd("export", full, out, *extra), cwd=REPO, env=ENV, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(listener, "mmrl_export.json")) as f:
        assert json.load(f)["name"] == "listener"
    assert os.path.isfile(os.path.join(speaker, "adapter_config.json"))     # the speaker trained a LoRA
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(listener)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    trained_weights = load_file(os.path.join(ckpt, "policies", "listener", "policy.safetensors"))
    exported = model.state_dict()
    same = [k for k, v in trained_weights.items() if k in exported and torch.equal(exported[k], v)]
    assert len(same) > 10 and len(same) == len([k for k in trained_weights if k in exported])
    bad = subprocess.run(mmrl_cmd("export", full, str(tmp_path / "x"), "--policy", "teacher"), cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "policy, listener" in bad.stderr
