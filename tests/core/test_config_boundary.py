"""Every name, enumerated value and range of a config is checked at load, before anything is
built: a typo exits 2 with a message that names the key and the valid values, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mmrl.cli import main
from mmrl.config import ConfigError, load_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BANDIT = os.path.join(REPO, "configs", "tiny", "bandit.yaml")
VLM_TINY = os.path.join(REPO, "configs", "tiny", "vlm_tiny.yaml")
SD3_TINY = os.path.join(REPO, "configs", "tiny", "sd3_tiny.yaml")

# (override, key named in the message, one valid value the message must list)
ENUMERATED = [
    ("algo.advantage=gae", "algo.advantage", "rloo"),
    ("algo.aggregation=tokenmean", "algo.aggregation", "token-mean"),
    ("algo.ratio_level=seq", "algo.ratio_level", "sequence"),
    ("algo.reward_combine=sum", "algo.reward_combine", "advantage_sum"),
    ("algo.filter=topk", "algo.filter", "starpo"),
    ("algo.kl_estimator=k4", "algo.kl_estimator", "k3"),
    ("optim.schedule=exponential", "optim.schedule", "cosine"),
    ("precision=fp64", "precision", "bf16"),
    ("policy.name=bandits", "policy.name", "diffusion"),
]


def _error(config: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(config, list(overrides))
    return str(e.value)


@pytest.mark.parametrize("override,key,valid", ENUMERATED)
def test_enumerated_keys_name_the_key_and_the_valid_values(override, key, valid):
    msg = _error(BANDIT, override)
    assert f"'{key}'" in msg and valid in msg and override.split("=")[1] in msg


@pytest.mark.parametrize("override,key,valid", ENUMERATED)
def test_cli_exits_2_before_building_anything(override, key, valid, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", VLM_TINY, override, f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert f"'{key}'" in err and valid in err and "Traceback" not in err
    assert not out.exists()                        # no run directory, no model, no rollout


def test_cli_subprocess_acceptance_case(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "mmrl", "train", VLM_TINY, "algo.aggregation=tokenmean",
                        f"output_dir={out}"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "'algo.aggregation'" in p.stderr and "seq-mean-token-sum-norm" in p.stderr
    assert "Traceback" not in p.stderr and not out.exists()


@pytest.mark.parametrize("override,key", [
    ("algo.filter_keep_frac=0", "algo.filter_keep_frac"),
    ("algo.filter_keep_frac=1.5", "algo.filter_keep_frac"),
    ("algo.clip_low=1.0", "algo.clip_low"),
    ("algo.clip_low=-0.1", "algo.clip_low"),
    ("algo.clip_high=-0.2", "algo.clip_high"),
    ("algo.dual_clip=1.0", "algo.dual_clip"),
    ("algo.adv_clip=0", "algo.adv_clip"),
    ("algo.kl_beta=-1", "algo.kl_beta"),
    ("algo.max_len_norm=0", "algo.max_len_norm"),
    ("algo.best_worst_k=5", "algo.best_worst_k"),      # group_size 8: at most 4
    ("train.group_size=1", "train.group_size"),
    ("train.prompts_per_step=0", "train.prompts_per_step"),
    ("train.grad_accum_steps=-1", "train.grad_accum_steps"),
    ("train.ema_decay=1.0", "train.ema_decay"),
    ("train.ema_decay=-0.1", "train.ema_decay"),
    ("train.ema_every=0", "train.ema_every"),
    ("optim.lr=0", "optim.lr"),
    ("optim.beta2=1.0", "optim.beta2"),
    ("optim.max_nonfinite_in_a_row=0", "optim.max_nonfinite_in_a_row"),
    ("checkpoint.keep_last=0", "checkpoint.keep_last"),
    ("eval.max_prompts=0", "eval.max_prompts"),
    ("max_steps=-1", "max_steps"),
    ("policy.num_arms=0", "policy.num_arms"),
])
def test_numeric_ranges(override, key):
    msg = _error(BANDIT, override)
    assert f"'{key}'" in msg and override.split("=")[1] in msg


def test_valid_edges_load():
    cfg = load_config(BANDIT, ["algo.filter_keep_frac=1.0", "algo.clip_low=0", "algo.best_worst_k=4",
                               "algo.dual_clip=3", "train.group_size=2", "algo.best_worst_k=1"])
    assert cfg.algo.best_worst_k == 1 and cfg.train.group_size == 2


def test_renamed_key_names_the_new_one():
    msg = _error(BANDIT, "algo.best_of_n=2")
    assert "'algo.best_of_n'" in msg and "algo.best_worst_k" in msg


def test_renamed_key_in_a_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(open(BANDIT).read().replace("algo: {advantage: grpo,", "algo: {best_of_n: 2, advantage: grpo,"))
    assert "algo.best_worst_k" in _error(str(path))


def test_unknown_reward_and_reward_arguments(tmp_path):
    msg = _error(BANDIT, "rewards=[{name: formats}]")
    assert "'rewards[0].name'" in msg and "unknown reward 'formats'" in msg and "numeric" in msg
    msg = _error(BANDIT, "rewards=[{name: numeric, rel_tolerance: 0.1}]")
    assert "'rewards[0].name'" in msg and "'rel_tolerance'" in msg and "rel_tol" in msg
    assert load_config(BANDIT, ["rewards=[{name: numeric, rel_tol: 0.1}]"]).rewards[0]["rel_tol"] == 0.1
    msg = _error(BANDIT, f"rewards=[{{name: '{tmp_path}/nope.py:fn'}}]")
    assert "does not exist" in msg and "nope.py" in msg
    msg = _error(BANDIT, "rewards=[{name: 'mmrl.bandit:no_such_fn'}]")
    assert "has no attribute 'no_such_fn'" in msg


def test_reward_plugin_with_kwargs_checked(tmp_path):
    plugin = tmp_path / "r.py"
    plugin.write_text("def score(samples, scale=1.0):\n    return [scale] * len(samples)\n")
    assert load_config(BANDIT, [f"rewards=[{{name: '{plugin}:score', scale: 2}}]"]).rewards
    msg = _error(BANDIT, f"rewards=[{{name: '{plugin}:score', scael: 2}}]")
    assert "'scael'" in msg and "scale" in msg


def test_data_sources_are_checked_at_load(tmp_path):
    msg = _error(BANDIT, f"data.train={tmp_path}/missing.jsonl")
    assert "'data.train'" in msg and "does not exist" in msg
    msg = _error(BANDIT, "data.train=mmrl.bandit:nothing")
    assert "'data.train'" in msg and "has no attribute" in msg
    msg = _error(BANDIT, "data.train_kwargs.num_context=3")
    assert "'data.train_kwargs'" in msg and "'num_context'" in msg
    msg = _error(BANDIT, "data.eval=null")
    assert "'eval.every'" in msg and "data.eval" in msg
    assert load_config(BANDIT, ["data.eval=null", "eval.every=0"]).data.eval is None


def test_policy_section_choices_before_any_model(monkeypatch):
    import vlm.policy

    def no_build(*a, **k):
        raise AssertionError("a model was built")

    monkeypatch.setattr(vlm.policy, "build", no_build)
    msg = _error(VLM_TINY, "policy.backend=tensorrt")
    assert "'policy.backend'" in msg and "vllm" in msg
    msg = _error(VLM_TINY, "policy.old_log_probs=never")
    assert "'policy.old_log_probs'" in msg and "deferred" in msg
    msg = _error(SD3_TINY, "policy.sde_schedule=ddpm")
    assert "'policy.sde_schedule'" in msg and "dance_grpo" in msg
    msg = _error(SD3_TINY, "policy.timesteps.select=every")
    assert "'policy.timesteps.select'" in msg and "window" in msg


def test_output_dir_naming_a_file(tmp_path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("not a directory")
    assert main(["train", BANDIT, f"output_dir={f}"]) == 2
    err = capsys.readouterr().err
    assert "'output_dir'" in err and "existing file" in err and "Traceback" not in err
    assert f.read_text() == "not a directory"


def test_missing_extras_are_config_errors(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    msg = _error(BANDIT, "logging.wandb=true")
    assert "'logging.wandb'" in msg and "mmrl[wandb]" in msg


def test_third_party_adapter_by_reference(tmp_path):
    """`policy.name: file.py:attr` names an adapter outside mmrl: no edit of the registry."""
    from mmrl.trainer import train

    adapter = tmp_path / "my_adapter.py"
    adapter.write_text(
        "from dataclasses import dataclass\n"
        "import mmrl.bandit as base\n\n"
        "@dataclass(frozen=True)\n"
        "class Config(base.Config):\n"
        "    name: str = 'mine'\n\n"
        "class Adapter:\n"
        "    Config = Config\n"
        "    calls = []\n\n"
        "    @staticmethod\n"
        "    def build(cfg, ctx):\n"
        "        Adapter.calls.append(cfg.name)\n"
        "        return base.build(cfg, ctx)\n")
    ref = f"{adapter}:Adapter"
    cfg = load_config(BANDIT, [f"policy.name={ref}", f"output_dir={tmp_path / 'run'}", "max_steps=2",
                               "eval.every=0", "checkpoint.every=0"])
    assert type(cfg.policy).__module__.startswith("mmrl_user_my_adapter")
    train(cfg)
    assert os.path.isfile(tmp_path / "run" / "metrics.jsonl")
    msg = _error(BANDIT, "policy.name=mmrl.bandit:match")
    assert "'policy.name'" in msg and "not an adapter" in msg


def test_a_reward_that_cannot_load_its_model_is_a_config_error(tmp_path, capsys):
    plugin = tmp_path / "heavy.py"
    plugin.write_text("class Heavy:\n"
                      "    def __init__(self, checkpoint='org/missing'):\n"
                      "        raise OSError(f'{checkpoint} is not a local folder and the hub is unreachable')\n"
                      "    def __call__(self, samples):\n"
                      "        return [0.0] * len(samples)\n")
    code = main(["train", BANDIT, f"output_dir={tmp_path / 'run'}", f"rewards=[{{name: '{plugin}:Heavy'}}]"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "building it" in err and "org/missing is not a local folder" in err
