"""A two-node Ray cluster simulated on this machine (`ray start --head` with a `learner` resource, a second
`ray start --address=...` with a `rollout` resource and its own CPUs): `mmrl train ... asynchronous.address=auto`
places its rollout workers on the second node and learns on the first. Each `ray start` runs in a session of its
own, and the fixture ends the cluster by killing those two process groups (the nodes' daemons and the workers
their raylets started), never with `ray stop`, which would end every Ray process of the machine (another test
process's cluster too)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from tests import BANDIT, REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def two_nodes(free_port):
    pytest.importorskip("ray")
    short = tempfile.mkdtemp(prefix="ray", dir="/tmp")     # Ray's unix sockets allow paths of 107 bytes at most
    env = {**os.environ, "RAY_TMPDIR": short, "RAY_AUTH_MODE": "token"}
    port = free_port()
    ray = [os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--disable-usage-stats"]

    groups = []

    def start(*args):
        proc = subprocess.Popen(ray + list(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)          # its daemons stay in its process group
        groups.append(proc.pid)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]

    try:
        start("--head", f"--port={port}", "--num-cpus=1", '--resources={"learner": 1}', "--include-dashboard=false")
        start(f"--address=127.0.0.1:{port}", "--num-cpus=2", '--resources={"rollout": 2}')
        yield env
    finally:
        for group in reversed(groups):
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(short, ignore_errors=True)


def test_rollout_workers_run_on_the_second_node_through_address_auto(two_nodes, tmp_path, mmrl_cmd, train_rows):
    out = tmp_path / "run"
    done = subprocess.run(mmrl_cmd("train", BANDIT, f"output_dir={out}", "max_steps=4", "eval.every=0",
                                   "asynchronous.enabled=true", "asynchronous.address=auto",
                                   "asynchronous.rollout_workers=2", "asynchronous.worker_resources={rollout: 1}",
                                   "asynchronous.max_staleness=1", "algo.objective=decoupled"),
                          cwd=REPO, env=two_nodes, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    placed = re.findall(r"rollout worker (\d) on (this node|node \w+)", done.stdout)
    assert sorted(w for w, _ in placed) == ["0", "1"], done.stdout
    assert all(where.startswith("node ") for _, where in placed), done.stdout      # not the learner's node
    assert len(train_rows(out)) == 4
