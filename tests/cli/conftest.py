import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest


@pytest.fixture(scope="module")
def started(request, tmp_path_factory, mmrl_cmd, selected):
    """The `mmrl` calls of the module's selected tests, all started when its first test asks: its `CALLS`,
    {test name: function(folder) -> [args of each call, in order]}, where the function writes into the test's
    own folder what the calls read. Each call is one process that spends most of its time importing on one
    core, so they run two at a time, in the module's order; returns {test name: (folder, [Future of the call's
    CompletedProcess, text output])}. Every call is over when the module ends (2 minutes at most each)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {}
        for name, calls in request.module.CALLS.items():
            if name in selected:
                folder = tmp_path_factory.mktemp(name[5:40])
                jobs[name] = folder, [pool.submit(subprocess.run, mmrl_cmd(*args), capture_output=True, text=True,
                                                  timeout=120) for args in calls(folder)]
        yield jobs


@pytest.fixture
def cli_runs(request, started):
    """(the test's folder, the CompletedProcess of each of its `mmrl` calls in the module's CALLS, in order):
    `python -m mmrl ARGS` run to its end, output as text."""
    folder, jobs = started[request.node.originalname]
    return folder, [job.result() for job in jobs]
