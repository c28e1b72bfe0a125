"""Paths and the CLI command for tests in every folder.

Tests import these as `from testkit import ...`, never `from conftest import ...`: several folders
have a conftest.py, and when folders are collected together `conftest` names whichever was
imported first (the suite's own guard is tests/test_layout.py)."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BANDIT = os.path.join(REPO, "configs", "tiny", "bandit.yaml")


def mmrl_cmd(*args: str) -> list[str]:
    """The CLI as a subprocess: `python -m mmrl ...` with the test's interpreter."""
    return [sys.executable, "-m", "mmrl", *args]
