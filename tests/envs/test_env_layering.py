"""envs/ sits at the bottom of the house, beside rewards: it imports neither the core nor an adapter, and
rewards never imports it."""

import os

from testkit import REPO, fresh_python as _run


def test_envs_import_no_core_adapter_or_world():
    _run("import sys, envs, envs.bandit, envs.frozenlake, envs.sokoban, envs.gym_adapter; "
         "up = {m.split('.')[0] for m in sys.modules} & {'mmrl', 'vlm', 'diffusion', 'shapes_world'}; "
         "assert not up, sorted(up)")


def test_rewards_do_not_import_envs():
    _run("import sys, rewards.builtin; assert 'envs' not in {m.split('.')[0] for m in sys.modules}")


def test_the_core_imports_no_environment_until_a_config_names_one():
    _run("import sys, mmrl.trainer, mmrl.collect, mmrl.config; "
         "assert 'envs' not in {m.split('.')[0] for m in sys.modules}, 'mmrl imported envs at module level'")
    assert os.path.isdir(os.path.join(REPO, "envs"))
