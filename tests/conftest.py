import pytest

from testkit import BANDIT, REPO


@pytest.fixture
def repo_root() -> str:
    return REPO


@pytest.fixture
def bandit_config() -> str:
    return BANDIT


@pytest.fixture
def eval_curve_of():
    """`eval_curve_of(config, out_dir, *overrides)`: train `config` in process and return its
    held-out curve [(step, eval/reward/mean), ...] read back from metrics.jsonl."""
    from mmrl.config import load_config
    from mmrl.reporting.summary import read_rows
    from mmrl.loop.trainer import train

    def run(config: str, out_dir, *overrides: str) -> list[tuple[int, float]]:
        train(load_config(config, [f"output_dir={out_dir}", *overrides]))
        return [(r["step"], r["eval/reward/mean"]) for r in read_rows(str(out_dir)) if "eval/reward/mean" in r]

    return run
