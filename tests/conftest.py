import os
import re
import shutil
import subprocess

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
