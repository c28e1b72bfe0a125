import json
import os
import socket

from mmrl.config import load_config
from mmrl.loop.trainer import setup

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BANDIT = os.path.join(REPO, "configs", "tiny", "bandit.yaml")


def bandit_cfg(tmp_path, *overrides):
    return load_config(BANDIT, [f"output_dir={tmp_path}", *overrides])


def read_metrics(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_rows(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "loss" in r]


def run_bandit(tmp_path, *overrides):
    run = setup(bandit_cfg(tmp_path, *overrides))
    run.fit()
    return run


def free_port() -> int:
    """A TCP port nobody listens on, for a 2-process rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
