"""The core loads no environment until a config names one (the layering itself, envs at the bottom beside
rewards, is an import-linter contract: tests/test_import_contracts.py)."""

import os


def test_the_core_imports_no_environment_until_a_config_names_one(fresh_python, repo_root):
    fresh_python("import sys, mmrl.loop.trainer, mmrl.loop.collect, mmrl.config; "
         "assert 'envs' not in {m.split('.')[0] for m in sys.modules}, 'mmrl imported envs at module level'")
    assert os.path.isdir(os.path.join(repo_root, "envs"))
