"""Multi-turn agents through the CLI (subprocesses): a user environment from a file reference trains,
evaluates and resumes bit-exactly after SIGKILL; gymnasium's FrozenLake-v1 runs as registered (its run starts
with the module's first test, beside the runs of the first)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from omegaconf import OmegaConf

from tests import REPO

pytestmark = [pytest.mark.slow, pytest.mark.integration]
AGENT = os.path.join(REPO, "configs", "tiny", "agent_tiny.yaml")
CORRIDOR = os.path.join(REPO, "tests", "vlm", "agent_env.py") + ":Corridor"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def config(tmp_path, env: dict, **policy) -> str:
    node = OmegaConf.load(AGENT)
    node.env = env
    for k, v in policy.items():
        node.policy[k] = v
    path = tmp_path / f"agent_{abs(hash(str(env)))}.yaml"
    OmegaConf.save(node, path)
    return str(path)


def metrics(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/peak_"))} for r in rows]


def latest(run: str) -> int:
    try:
        with open(os.path.join(run, "checkpoints", "latest")) as f:
            return int(f.read().strip().split("_")[1])
    except (FileNotFoundError, ValueError, IndexError):
        return 0


@pytest.fixture(scope="module", autouse=True)
def gym_run(tmp_path_factory, in_background, mmrl_cmd, selected):
    """(output directory, Future of the CompletedProcess) of the FrozenLake-v1 run when its test is selected."""
    if "test_gymnasium_frozenlake_runs_as_registered" not in selected:
        return None
    folder = tmp_path_factory.mktemp("gym")
    cfg, out = config(folder, {"name": "gym:FrozenLake-v1", "max_turns": 2}), str(folder / "gym")
    cmd = mmrl_cmd("train", cfg, f"output_dir={out}", "max_steps=1", "eval.every=1")
    return out, in_background(subprocess.run, cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)


def test_a_file_environment_trains_and_resumes_bit_exactly_after_sigkill(tmp_path, mmrl_cmd):
    cfg = config(tmp_path, {"name": CORRIDOR, "length": 3, "max_turns": 3, "step_reward": -0.1},
                 format_prompt="none")                  # any reply is an action: rewards vary from the start
    common = [cfg, "max_steps=8", "checkpoint.every=2", "eval.every=4", "algo.filter.name=none"]
    full, broken = str(tmp_path / "full"), str(tmp_path / "broken")
    unbroken = subprocess.Popen(mmrl_cmd("train", *common, f"output_dir={full}"), cwd=REPO, env=ENV,   # beside the
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)        # broken run
    proc = subprocess.Popen(mmrl_cmd("train", *common, f"output_dir={broken}"), cwd=REPO, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while latest(broken) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 2 <= latest(broken) < 8
    _, err = unbroken.communicate(timeout=600)                        # reads stderr: a full pipe never stalls it
    assert unbroken.returncode == 0, err[-3000:]
    rows = metrics(full)
    trained = [r for r in rows if "loss" in r]
    assert [r["step"] for r in trained] == list(range(1, 9))
    assert any(r["grad_norm"] > 0 for r in trained)       # the policy did change, so resuming could go wrong
    assert all(r["ratio/first_max_abs_dev"] == 0.0 for r in trained)
    for key in ("env/turns/mean", "env/success", "env/invalid_action_frac", "env/reward_group_std", "env/distinct_2"):
        assert key in trained[0], key
    assert "eval/success" in rows[0] and "eval/success" in trained[-1]
    again = subprocess.run(mmrl_cmd("train", *common, f"output_dir={broken}", "resume=auto"), cwd=REPO, env=ENV,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert without_time(metrics(broken)) == without_time(rows)


def test_gymnasium_frozenlake_runs_as_registered(gym_run):
    out, job = gym_run
    done = job.result()
    assert done.returncode == 0, done.stderr[-3000:]
    last = metrics(out)[-1]
    assert last["step"] == 1 and 1 <= last["env/turns/mean"] <= 2 and "eval/success" in last
    with open(os.path.join(out, "samples", "eval_step_000001.jsonl")) as f:
        first = json.loads(f.readline())
    assert "P" in first["prompt"]                          # the text grid marks the agent
