"""Resume after SIGKILL continues exactly like an unbroken run (CPU, fixed seed), with an EMA of the weights
(train.ema_decay, mmrl/loop/ema.py): the evaluations run on the average, so it must be restored exactly too. The
EMA only adds files and swaps to the checkpoint path of a run without one (tests/core/test_ema.py)."""

import os
import signal
import subprocess
import time

import pytest

from tests import BANDIT

pytestmark = pytest.mark.integration
COMMON = [BANDIT, "max_steps=24", "checkpoint.every=4", "eval.every=6", "policy.sleep_s=0.05",
          "algo.kl_beta=0.05", "optim.schedule=cosine", "optim.warmup_steps=3", "train.ema_decay=0.9",
          "train.ema_every=2"]


def _without_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/peak_"))} for r in rows]


def _latest_step(run_dir) -> int:
    try:
        with open(os.path.join(run_dir, "checkpoints", "latest")) as f:
            return int(f.read().strip().split("_")[1])
    except (FileNotFoundError, ValueError, IndexError):
        return 0


def test_resume_after_sigkill_matches_unbroken_run(tmp_path, mmrl_cmd, read_metrics):
    full, broken = tmp_path / "full", tmp_path / "broken"
    unbroken = subprocess.Popen(mmrl_cmd("train", *COMMON, f"output_dir={full}"),   # beside the broken run: 2 cores
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(mmrl_cmd("train", *COMMON, f"output_dir={broken}"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while _latest_step(broken) < 8 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.1)  # kill somewhere after the step-8 checkpoint, mid-way through later steps
    assert proc.poll() is None, "the run finished before it could be killed; raise policy.sleep_s"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = _latest_step(broken)
    assert 8 <= killed_at < 24
    _, err = unbroken.communicate(timeout=180)                        # reads stderr: a full pipe never stalls it
    assert unbroken.returncode == 0, err[-3000:]

    subprocess.run(mmrl_cmd("train", *COMMON, f"output_dir={broken}", "resume=auto"),
                   check=True, capture_output=True, timeout=180)
    a, b = _without_time(read_metrics(full)), _without_time(read_metrics(broken))
    assert [r["step"] for r in b] == [r["step"] for r in a]
    assert a == b
    last = os.path.join("checkpoints", "step_000024")                # the trained and the averaged weights
    for name in ("policy.safetensors", "policy_ema.safetensors", "ema.safetensors"):
        assert (full / last / name).read_bytes() == (broken / last / name).read_bytes()
