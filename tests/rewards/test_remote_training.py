"""`mmrl train` with its reward behind `mmrl rewards serve`, all through subprocesses: the same
metrics as the local reward; a server killed mid-run stops training (exit 1, the URL in the
message) and a restarted one lets `resume=auto` finish."""

import json
import os
import subprocess
import threading

import pytest

from tests import BANDIT

pytestmark = pytest.mark.integration
REWARD = "mmrl.testing.bandit:match"


def _train(mmrl_cmd, out, *overrides, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(mmrl_cmd("train", BANDIT, f"output_dir={out}", *overrides),
                          capture_output=True, text=True, timeout=180)
    assert not check or done.returncode == 0, done.stderr[-3000:]
    return done


def _rows(out) -> list[dict]:
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def _remote(url: str, **kw) -> str:
    extra = "".join(f", {k}: {v}" for k, v in kw.items())
    return f"rewards=[{{name: remote, url: '{url}', label: match{extra}}}]"


@pytest.mark.slow
def test_a_served_reward_trains_exactly_as_the_local_one(tmp_path, mmrl_cmd, start_cli_server, in_background):
    common = ["max_steps=4", "eval.every=2"]
    local = in_background(_train, mmrl_cmd, tmp_path / "local", *common,    # beside the server's start and the
                          f"rewards=[{{name: '{REWARD}', label: match}}]")   # remote run
    server, url = start_cli_server(REWARD, "--token", "t0k")
    try:
        _train(mmrl_cmd, tmp_path / "remote", *common, _remote(url, token="t0k", batch_size=5, max_concurrency=3))
        local.result()
    finally:
        server.terminate()
        server.wait(30)

    def rewards(rows):
        return [{k: v for k, v in r.items() if k.startswith(("reward/", "eval/reward/"))} for r in rows]

    local, remote = rewards(_rows(tmp_path / "local")), rewards(_rows(tmp_path / "remote"))
    assert len(local) == 5 and all(local) and remote == local


@pytest.mark.slow
def test_a_killed_server_stops_training_naming_it_and_resume_finishes(tmp_path, mmrl_cmd, start_cli_server):
    out, steps = tmp_path / "run", 16
    common = [f"max_steps={steps}", "eval.every=0", "checkpoint.every=2", "policy.sleep_s=0.2"]
    server, url = start_cli_server(REWARD)
    common.append(_remote(url, retries=1, backoff_s=0.1))         # resume asks for the same rewards
    train = subprocess.Popen(mmrl_cmd("train", BANDIT, f"output_dir={out}", *common),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        done = threading.Event()
        while len(_rows(out)) < 3 and train.poll() is None:
            done.wait(0.05)
        server.kill()
        server.wait(30)
        stderr = train.communicate(timeout=120)[1]
    finally:
        train.kill()
    assert train.returncode == 1, stderr[-3000:]
    assert "training stopped" in stderr and f"reward server {url}/score failed" in stderr
    stopped_at = max(r["step"] for r in _rows(out))
    assert 3 <= stopped_at < steps

    server, _ = start_cli_server(REWARD, port=int(url.rsplit(":", 1)[1]))
    try:
        _train(mmrl_cmd, out, *common, "resume=auto")
    finally:
        server.terminate()
        server.wait(30)
    assert max(r["step"] for r in _rows(out)) == steps
