"""The `mmrl` command line through a subprocess: help, smoke run, user errors."""

import json
import os

import pytest

pytestmark = pytest.mark.integration


def test_help_lists_commands_and_config_sections(cli):
    top = cli("--help")
    assert top.returncode == 0 and "train" in top.stdout and "rewards" in top.stdout
    train = cli("train", "--help")
    assert train.returncode == 0
    for section in ("train:", "optim:", "algo:", "checkpoint:", "logging:", "data:", "eval:"):
        assert section in train.stdout


def test_train_smoke_writes_run_directory(tmp_path, bandit_config, cli):
    out = cli("train", bandit_config, f"output_dir={tmp_path}", "max_steps=3")
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


def test_unknown_key_names_it_and_lists_valid_keys(tmp_path, bandit_config, cli):
    _user_error(cli("train", bandit_config, f"output_dir={tmp_path}", "optim.lrr=0.1"),
                "optim.lrr", "Valid keys in optim", "max_grad_norm")


def test_unknown_key_in_yaml_file(tmp_path, bandit_config, cli):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(open(bandit_config).read().replace("train: {prompts_per_step", "trian: {prompts_per_step"))
    _user_error(cli("train", str(cfg), f"output_dir={tmp_path}"), "trian", "top level")


def test_wrong_type_names_the_key(tmp_path, bandit_config, cli):
    _user_error(cli("train", bandit_config, f"output_dir={tmp_path}", "seed=abc"), "'seed'", "wrong type")


def test_unknown_policy_key_and_name(tmp_path, bandit_config, cli):
    _user_error(cli("train", bandit_config, f"output_dir={tmp_path}", "policy.num_armz=3"),
                "policy.num_armz", "num_arms")
    _user_error(cli("train", bandit_config, f"output_dir={tmp_path}", "policy.name=nope"), "policy.name", "bandit")


def test_missing_file_and_bad_override(tmp_path, bandit_config, cli):
    _user_error(cli("train", str(tmp_path / "none.yaml")), "does not exist")
    _user_error(cli("train", bandit_config, "max_steps"), "key=value")


def test_unknown_reward_lists_registered_ones(tmp_path, bandit_config, cli):
    _user_error(cli("train", bandit_config, f"output_dir={tmp_path}", "rewards=[{name: nope}]"),
                "unknown reward 'nope'", "format")


def test_reward_returning_wrong_length_stops_with_message(tmp_path, bandit_config, cli):
    bad = tmp_path / "bad_reward.py"
    bad.write_text("def short(samples):\n    return [1.0] * (len(samples) - 1)\n")
    out = cli("train", bandit_config, f"output_dir={tmp_path / 'run'}", f"rewards=[{{name: '{bad}:short'}}]")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "reward 'short' returned" in out.stderr and "samples" in out.stderr
