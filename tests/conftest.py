import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BANDIT = os.path.join(REPO, "configs", "tiny", "bandit.yaml")


@pytest.fixture
def repo_root() -> str:
    return REPO


@pytest.fixture
def bandit_config() -> str:
    return BANDIT


def mmrl_cmd(*args: str) -> list[str]:
    """The CLI as a subprocess: `python -m mmrl ...` with the test's interpreter."""
    return [sys.executable, "-m", "mmrl", *args]
