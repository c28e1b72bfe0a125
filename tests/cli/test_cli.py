"""The `mmrl` command line through a subprocess: help, smoke run, user errors.

Each test asserts on the `mmrl` calls that CALLS lists for it; the module starts them all, two at a time,
when its first test runs (the `started` fixture in this folder's conftest.py)."""

import json
import os

import pytest

from tests import BANDIT

pytestmark = pytest.mark.integration


def _bad_yaml(folder) -> str:
    cfg = folder / "bad.yaml"
    cfg.write_text(open(BANDIT).read().replace("train: {prompts_per_step", "trian: {prompts_per_step"))
    return str(cfg)


def _short_reward(folder) -> str:
    bad = folder / "bad_reward.py"
    bad.write_text("def short(samples):\n    return [1.0] * (len(samples) - 1)\n")
    return f"rewards=[{{name: '{bad}:short'}}]"


CALLS = {  # test: function(its folder) -> the args of each `mmrl` call it asserts on
    "test_help_lists_commands_and_config_sections": lambda d: [["--help"], ["train", "--help"]],
    "test_train_smoke_writes_run_directory": lambda d: [["train", BANDIT, f"output_dir={d}", "max_steps=3"]],
    "test_unknown_key_names_it_and_lists_valid_keys": lambda d: [["train", BANDIT, f"output_dir={d}", "optim.lrr=0.1"]],
    "test_unknown_key_in_yaml_file": lambda d: [["train", _bad_yaml(d), f"output_dir={d}"]],
    "test_wrong_type_names_the_key": lambda d: [["train", BANDIT, f"output_dir={d}", "seed=abc"]],
    "test_unknown_policy_key_and_name": lambda d: [["train", BANDIT, f"output_dir={d}", "policy.num_armz=3"],
                                                   ["train", BANDIT, f"output_dir={d}", "policy.name=nope"]],
    "test_missing_file_and_bad_override": lambda d: [["train", str(d / "none.yaml")], ["train", BANDIT, "max_steps"]],
    "test_unknown_reward_lists_registered_ones": lambda d: [["train", BANDIT, f"output_dir={d}",
                                                             "rewards=[{name: nope}]"]],
    "test_reward_returning_wrong_length_stops_with_message": lambda d: [["train", BANDIT, f"output_dir={d / 'run'}",
                                                                         _short_reward(d)]],
}


def test_help_lists_commands_and_config_sections(cli_runs):
    _, (top, train) = cli_runs
    assert top.returncode == 0 and "train" in top.stdout and "rewards" in top.stdout
    assert train.returncode == 0
    for section in ("train:", "optim:", "algo:", "checkpoint:", "logging:", "data:", "eval:"):
        assert section in train.stdout


def test_train_smoke_writes_run_directory(cli_runs):
    tmp_path, (out,) = cli_runs
    assert out.returncode == 0, out.stderr
    assert f"config written to {tmp_path / 'config.yaml'}" in out.stdout and "optim:" not in out.stdout
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]
    assert os.path.isfile(tmp_path / "config.yaml")
    assert "max_steps: 3" in open(tmp_path / "config.yaml").read()


def _user_error(result, *needles):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    for n in needles:
        assert n in result.stderr, (n, result.stderr)


def test_unknown_key_names_it_and_lists_valid_keys(cli_runs):
    _, (out,) = cli_runs
    _user_error(out, "optim.lrr", "Valid keys in optim", "max_grad_norm")


def test_unknown_key_in_yaml_file(cli_runs):
    _, (out,) = cli_runs
    _user_error(out, "trian", "top level")


def test_wrong_type_names_the_key(cli_runs):
    _, (out,) = cli_runs
    _user_error(out, "'seed'", "wrong type")


def test_unknown_policy_key_and_name(cli_runs):
    _, (key, name) = cli_runs
    _user_error(key, "policy.num_armz", "num_arms")
    _user_error(name, "policy.name", "bandit")


def test_missing_file_and_bad_override(cli_runs):
    _, (missing, override) = cli_runs
    _user_error(missing, "does not exist")
    _user_error(override, "key=value")


def test_unknown_reward_lists_registered_ones(cli_runs):
    _, (out,) = cli_runs
    _user_error(out, "unknown reward 'nope'", "format")


def test_reward_returning_wrong_length_stops_with_message(cli_runs):
    _, (out,) = cli_runs
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "reward 'short' returned" in out.stderr and "samples" in out.stderr
