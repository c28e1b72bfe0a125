import subprocess

import pytest


@pytest.fixture
def cli(mmrl_cmd):
    """`cli(*args, cwd=None)`: run `python -m mmrl *args` to its end (2 minutes at most); its output as text."""
    def run(*args, cwd=None):
        return subprocess.run(mmrl_cmd(*args), capture_output=True, text=True, timeout=120, cwd=cwd)

    return run
