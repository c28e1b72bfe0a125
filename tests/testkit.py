"""Paths and the CLI command for tests in every folder.

Tests import these as `from testkit import ...`, never `from conftest import ...`: several folders
have a conftest.py, and when folders are collected together `conftest` names whichever was
imported first (the suite's own guard is tests/test_layout.py)."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BANDIT = os.path.join(REPO, "configs", "tiny", "bandit.yaml")


def fresh_python(code: str) -> None:
    """Run `code` in a new interpreter at the repo root (import-order checks); fail with its stderr."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def mmrl_cmd(*args: str) -> list[str]:
    """The CLI as a subprocess: `python -m mmrl ...` with the test's interpreter."""
    return [sys.executable, "-m", "mmrl", *args]
