"""The core loads no environment until a config names one (the layering itself, envs at the bottom beside
rewards, is an import-linter contract: tests/test_import_contracts.py)."""

import os

from testkit import REPO, fresh_python as _run


def test_the_core_imports_no_environment_until_a_config_names_one():
    _run("import sys, mmrl.loop.trainer, mmrl.loop.collect, mmrl.config; "
         "assert 'envs' not in {m.split('.')[0] for m in sys.modules}, 'mmrl imported envs at module level'")
    assert os.path.isdir(os.path.join(REPO, "envs"))
