"""Fixtures every test folder shares. A helper is a fixture here (or in its folder's conftest.py),
never a module a test imports; functions that tests call with arguments are factory fixtures.

Markers (pyproject.toml): `integration` for what starts the CLI as a subprocess, several processes,
or trains a CPU default (left out by the inner loop, `pytest -m "not integration"`); `slow` for the
multi-second ones among them."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests import BANDIT, REPO


def pytest_collection_modifyitems(config, items):
    """In a pytest-xdist worker (`pytest -n 2 --dist loadfile`, the README's test command): the modules with the
    most `slow` tests first, in the same order on every worker, so that the long ones start at once and no long
    module ends the run alone on one core. Within a module, and without xdist, the order is the collection's."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow: dict[str, int] = {}
    for item in items:
        slow[item.nodeid.split("::")[0]] = slow.get(item.nodeid.split("::")[0], 0) + bool(item.get_closest_marker("slow"))
    first = {module: i for i, module in enumerate(dict.fromkeys(item.nodeid.split("::")[0] for item in items))}
    items.sort(key=lambda item: (-slow[item.nodeid.split("::")[0]], first[item.nodeid.split("::")[0]]))


def pytest_configure(config):
    """Each pytest-xdist worker computes on one thread (and so do the subprocesses it starts, through
    OMP_NUM_THREADS): two workers on two cores, none spin-waiting for a core the other holds."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def repo_root() -> str:
    return REPO


@pytest.fixture(scope="session")
def bandit_config() -> str:
    return BANDIT


def _mmrl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "mmrl", *args]


@pytest.fixture(scope="session")
def mmrl_cmd():
    """`mmrl_cmd("train", config, ...)`: the CLI as a subprocess command (`python -m mmrl ...` with
    the test's interpreter)."""
    return _mmrl_cmd


@pytest.fixture(scope="session")
def fresh_python():
    """`fresh_python(code)`: run `code` in a new interpreter at the repo root (import-order checks);
    fails with its stderr."""

    def run(code: str) -> None:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]

    return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def free_port():
    """`free_port()`: a TCP port of 127.0.0.1 nobody listens on (a 2-process rendezvous, a server)."""
    return _free_port


@pytest.fixture(scope="session")
def run_side_by_side():
    """`run_side_by_side([(cmd, env), ...], cwd=REPO, timeout=600)`: start every command at once and wait
    for all (a 1-process reference beside the 2-process run it is compared with: the 2 cores overlap the
    interpreters' start-up); fails naming the first command that exited non-zero, with its stderr tail."""

    def run(jobs, cwd: str = REPO, timeout: float = 600) -> None:
        procs = [subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for cmd, env in jobs]
        try:
            errs = [p.communicate(timeout=timeout)[1] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for (cmd, _), p, err in zip(jobs, procs, errs):
            assert p.returncode == 0, f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{err[-3000:]}"

    return run


@pytest.fixture(scope="module")
def in_background():
    """`in_background(fn, *args, **kwargs)`: call `fn(*args, **kwargs)` in a thread now and return its Future
    (`.result()` waits for it and raises what it raised). For the subprocess runs of a module's tests that do
    not depend on each other: started together, or before a test that trains in process on one thread, they
    keep both cores busy instead of one after the other; each test still asserts on its own run. The end of
    the module waits for every job."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        yield pool.submit


@pytest.fixture(scope="module")
def side_runs_of(in_background, selected):
    """`side_runs_of({name: (test, out_dir, command)})`: the commands whose test the session runs, one after the
    other in one background job from the repo root (beside a module's in-process run, on the other core); returns
    {name: (out_dir, Future of {name: CompletedProcess})} (see `side_run_curve`)."""
    def start(runs: dict) -> dict:
        job = in_background(lambda: {name: subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
                                     for name, (test, _, cmd) in runs.items() if test in selected})
        return {name: (out, job) for name, (_, out, _) in runs.items()}

    return start


@pytest.fixture(scope="module")
def selected(request) -> set[str]:
    """The names (without parameters) of the module's tests that this session runs: a module fixture that starts
    several tests' runs at once (`in_background`) starts those of the selected tests only."""
    return {item.originalname for item in request.session.items if item.module is request.module}


@pytest.fixture(scope="module")
def selected_params(request):
    """`selected_params(name)`: the values that the module's tests this session runs give the parameter `name`
    (the `selected` of a parametrized module)."""
    items = [item for item in request.session.items if item.module is request.module and hasattr(item, "callspec")]
    return lambda name: {item.callspec.params[name] for item in items if name in item.callspec.params}


def _read_metrics(run_dir) -> list[dict]:
    with open(os.path.join(str(run_dir), "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture
def read_metrics():
    """`read_metrics(run_dir)`: every row of RUN_DIR/metrics.jsonl (train and eval rows)."""
    return _read_metrics


@pytest.fixture
def comparable_rows():
    """`comparable_rows(run_dir)`: every row of RUN_DIR/metrics.jsonl without the keys that differ between two runs
    of the same training (`time/`, `mem/`, `async/`, also under a policy's name in a multi-role run:
    `listener/time/...`): what a run is compared with another by."""
    varying = ("time/", "mem/", "async/")

    def comparable(key: str) -> bool:
        return not key.startswith(varying) and not any(f"/{p}" in key for p in varying)

    return lambda run_dir: [{k: v for k, v in r.items() if comparable(k)} for r in _read_metrics(run_dir)]


def _run_samples(run_dir) -> dict:
    import numpy as np
    from PIL import Image

    folder = os.path.join(str(run_dir), "samples")
    out = {}
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".jsonl")):
        rows = [json.loads(line) for line in open(os.path.join(folder, name))]
        for r in rows:
            path = os.path.join(folder, str(r["output"]))
            if str(r["output"]).endswith(".png") and os.path.exists(path):
                r["output"] = np.asarray(Image.open(path)).tobytes()
        out[name] = rows
    return out


@pytest.fixture
def run_samples():
    """`run_samples(run_dir)`: every file of RUN_DIR/samples as {name: rows}, an image output replaced by its
    pixels (two runs sampled the same images when these are equal)."""
    return _run_samples


@pytest.fixture
def train_rows():
    """`train_rows(run_dir)`: the training rows of RUN_DIR/metrics.jsonl (those with a loss)."""
    return lambda run_dir: [r for r in _read_metrics(run_dir) if "loss" in r]


def _bandit_cfg(out_dir, *overrides: str):
    from mmrl.config import load_config

    return load_config(BANDIT, [f"output_dir={out_dir}", *overrides])


@pytest.fixture(scope="session")
def bandit_cfg():
    """`bandit_cfg(out_dir, *overrides)`: the tiny bandit config (configs/tiny/bandit.yaml), loaded
    and checked, writing to `out_dir`."""
    return _bandit_cfg


@pytest.fixture(scope="session")
def run_bandit():
    """`run_bandit(out_dir, *overrides)`: set up the tiny bandit run in process, train it to the end
    and return the run (its policy, optimizer, EMA and accelerator stay inspectable)."""
    from mmrl.loop.trainer import setup

    def run(out_dir, *overrides: str):
        r = setup(_bandit_cfg(out_dir, *overrides))
        r.fit()
        return r

    return run


@pytest.fixture(scope="session")
def eval_curve_of():
    """`eval_curve_of(config, out_dir, *overrides)`: train `config` in process and return its
    held-out curve [(step, eval/reward/mean), ...] read back from metrics.jsonl."""
    from mmrl.config import load_config
    from mmrl.loop.trainer import train

    def run(config: str, out_dir, *overrides: str) -> list[tuple[int, float]]:
        train(load_config(config, [f"output_dir={out_dir}", *overrides]))
        return _held_out_curve(out_dir)

    return run


def _held_out_curve(run_dir) -> list[tuple[int, float]]:
    from mmrl.reporting.summary import read_rows

    return [(r["step"], r["eval/reward/mean"]) for r in read_rows(str(run_dir)) if "eval/reward/mean" in r]


@pytest.fixture(scope="session")
def side_run_curve():
    """`side_run_curve((out_dir, job), name)`: the held-out curve [(step, eval/reward/mean), ...] of the run `name`
    that a module's background job (`in_background`, returning {name: CompletedProcess}) wrote into `out_dir`,
    once that run has exited with status 0."""
    def curve(side_run, name: str) -> list[tuple[int, float]]:
        out, job = side_run
        done = job.result()[name]
        assert done.returncode == 0, done.stderr[-3000:]
        return _held_out_curve(out)

    return curve


BROWSERS = ("chromium-headless-shell", "chromium", "google-chrome")


@pytest.fixture
def rendered_report():
    """`rendered_report(run_dir)`: open RUN_DIR/report.html in a real headless browser (Debian's
    chromium-headless-shell, which .ci/run installs) and return (figures the page holds, figures the
    browser drew, the DOM after load). Without a browser the test skips, and fails where
    MMRL_REQUIRE_BROWSER=1 (.ci/run sets it)."""

    def render(run_dir) -> tuple[int, int, str]:
        browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
        if browser is None:
            if os.environ.get("MMRL_REQUIRE_BROWSER") == "1":
                pytest.fail("no headless browser (apt-get install chromium-headless-shell); MMRL_REQUIRE_BROWSER=1")
            pytest.skip("no headless browser: apt-get install chromium-headless-shell")
        page = os.path.join(str(run_dir), "report.html")
        assert os.path.isfile(page), f"{page} was not written"
        done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                               "--dump-dom", "file://" + os.path.abspath(page)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        body = re.search(r"<body[^>]*>", done.stdout)
        assert body, done.stdout[:2000]
        figures = re.search(r'data-figures="(\d+)"', body.group(0))
        rendered = re.search(r'data-rendered="(\d+)"', body.group(0))
        assert figures and rendered, body.group(0)
        return int(figures.group(1)), int(rendered.group(1)), done.stdout

    return render


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 2 CPUs for the tests of one module (the asynchronous trainer's integration runs)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
