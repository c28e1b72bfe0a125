"""The sandboxed Python tool (tools/sandbox.py): its limits hold (an infinite loop, a sleep, a memory bomb, a fork
bomb, a subprocess, reading and writing outside its scratch directory, the network, native code, a flood of
output), the scratch directory is removed, and a failing program is a result with its traceback."""

from __future__ import annotations

import os
import tempfile
import time

import pytest

from tools import ToolFailed
from tools.sandbox import has_network_namespace, python

REPO_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")


@pytest.fixture
def scratch_root(tmp_path, monkeypatch):
    """The folder the sandbox's scratch directories are made in (to see that they are removed)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_program_runs_and_prints(scratch_root):
    assert python("import numpy as np\nprint(np.arange(4).sum())") == "6\n"
    assert python("open('notes.txt', 'w').write('kept')\nprint(open('notes.txt').read())") == "kept\n"
    assert os.listdir(scratch_root) == []                                  # scratch and output removed


def test_a_failing_program_is_a_result_with_its_traceback():
    out = python("x = 1\n1 / 0")
    assert out == ('Traceback (most recent call last):\n  File "<tool>", line 2, in <module>\n'
                   "ZeroDivisionError: division by zero\n\n[exit status 1]")
    assert python("raise SystemExit(3)") == "[exit status 3]"


def test_an_infinite_loop_stops_at_its_cpu_time():
    start = time.monotonic()
    with pytest.raises(ToolFailed, match="ran past its 1 s of CPU time") as e:
        python("while True:\n    pass", cpu_s=1, wall_s=20)
    assert e.value.kind == "timeout" and time.monotonic() - start < 5


def test_a_sleep_stops_at_its_wall_time_and_leaves_nothing(scratch_root):
    start = time.monotonic()
    with pytest.raises(ToolFailed, match="ran past its 1 s of wall time") as e:
        python("import time\ntime.sleep(60)", wall_s=1)
    assert e.value.kind == "timeout" and time.monotonic() - start < 5
    assert os.listdir(scratch_root) == []


@pytest.mark.parametrize("code", ["x = bytearray(8 << 30)", "a = []\nwhile True:\n    a.append(bytearray(64 << 20))"])
def test_a_memory_bomb_raises_memory_error(code):
    out = python(code, memory_mb=512)
    assert out.endswith("MemoryError\n\n[exit status 1]")


@pytest.mark.parametrize("code", ["import os\nwhile True:\n    os.fork()",
                                  "import subprocess\nsubprocess.run(['sleep', '1'])",
                                  "import os\nos.system('echo hi')",
                                  "import os\nos.execv('/bin/sh', ['sh'])"])
def test_no_process_can_be_started(code):
    assert "PermissionError: the sandbox may not start processes" in python(code)


@pytest.mark.parametrize("code, what", [
    ("print(open('/etc/hostname').read())", "may not read '/etc/hostname'"),
    (f"print(open({REPO_FILE!r}).read())", "may not read"),
    ("open('/tmp/mmrl-escape.txt', 'w').write('x')", "may not write '/tmp/mmrl-escape.txt'"),
    ("import os\nprint(os.listdir('/'))", "may not touch '/'"),
    ("import os\nos.remove('/tmp/anything')", "may not touch '/tmp/anything'"),
    ("import ctypes\nctypes.CDLL(None).getpid()", "may not call native code"),
])
def test_nothing_outside_the_scratch_directory_is_reachable(code, what):
    out = python(code)
    assert f"PermissionError: the sandbox {what}" in out, out
    assert not os.path.exists("/tmp/mmrl-escape.txt")


def test_there_is_no_network():
    out = python("import socket\nsocket.create_connection(('10.255.255.1', 80), timeout=2)\nprint('connected')")
    assert "connected" not in out
    if has_network_namespace():
        assert "Network is unreachable" in out
    else:
        assert "the sandbox has no network" in out


def test_a_flood_of_output_is_cut_at_the_file_limit():
    out = python("print('x' * (8 << 20))", file_mb=1)
    assert out.startswith("x" * (1 << 20) + "\n[the output past 1 MB was cut]")
