"""Every name, enumerated value and range of a config is checked at load, before anything is
built: a typo exits 2 with a message that names the key and the valid values, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from mmrl.cli import main
from mmrl.config import MOVED, SECTIONS, ConfigError, load_config, migrate
from mmrl.algorithms.filtering import FilterConfig
from tests import BANDIT, REPO

VLM_TINY = os.path.join(REPO, "configs", "tiny", "vlm_tiny.yaml")
SD3_TINY = os.path.join(REPO, "configs", "tiny", "sd3_tiny.yaml")

# (override, key named in the message, one valid value the message must list)
ENUMERATED = [
    ("algo.advantage=gae", "algo.advantage", "rloo"),
    ("algo.aggregation=tokenmean", "algo.aggregation", "token-mean"),
    ("algo.policy_loss=gspo2", "algo.policy_loss", "grpo_guard"),
    ("algo.objective=ppo", "algo.objective", "nft"),
    ("algo.reward_combine=sum", "algo.reward_combine", "advantage_sum"),
    ("algo.filter.name=topk", "algo.filter.name", "starpo"),
    ("algo.kl_estimator=k4", "algo.kl_estimator", "k3"),
    ("optim.schedule=exponential", "optim.schedule", "cosine"),
    ("precision=fp64", "precision", "bf16"),
    ("policy.name=bandits", "policy.name", "diffusion"),
]


def _error(config: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(config, list(overrides))
    return str(e.value)


def _flat_keys_common(run) -> list[str]:
    return [f"output_dir={run}", "checkpoint.every=2", "eval.every=0", "algo.filter.name=starpo",
            "algo.filter.keep_frac=0.5"]


@pytest.fixture(scope="module", autouse=True)
def started(tmp_path_factory, in_background, selected):
    """{test name: (its folder, Future of the CompletedProcess)}: the `mmrl train` subprocesses of the module's
    selected integration tests (of the run saved with flat keys, its first run), started with the module's
    first test, so that they run beside the in-process tests before theirs."""
    commands = {  # test: (function(its folder) -> the args of `mmrl train`, timeout)
        "test_cli_subprocess_acceptance_case":
            (lambda d: [VLM_TINY, "algo.aggregation=tokenmean", f"output_dir={d / 'run'}"], 120),
        "test_the_cli_exits_2_naming_the_new_key": (lambda d: [VLM_TINY, f"output_dir={d}", "algo.nft_beta=1"], 120),
        "test_a_run_saved_with_flat_keys_resumes_and_its_config_loads_for_export":
            (lambda d: [BANDIT, "max_steps=2", *_flat_keys_common(d / "run")], 300),
    }
    jobs = {}
    for name, (args, timeout) in commands.items():
        if name in selected:
            folder = tmp_path_factory.mktemp(name[5:30])
            jobs[name] = folder, in_background(subprocess.run, [sys.executable, "-m", "mmrl", "train", *args(folder)],
                                               capture_output=True, text=True, cwd=REPO, timeout=timeout)
    return jobs


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


@pytest.mark.integration
def test_cli_subprocess_acceptance_case(started):
    folder, job = started["test_cli_subprocess_acceptance_case"]
    out, p = folder / "run", job.result()
    assert p.returncode == 2, p.stderr
    assert "'algo.aggregation'" in p.stderr and "seq-mean-token-sum-norm" in p.stderr
    assert "Traceback" not in p.stderr and not out.exists()


@pytest.mark.parametrize("override,key", [
    ("algo.filter.keep_frac=0", "algo.filter.keep_frac"),
    ("algo.filter.keep_frac=1.5", "algo.filter.keep_frac"),
    ("algo.clip_low=1.0", "algo.clip_low"),
    ("algo.clip_low=-0.1", "algo.clip_low"),
    ("algo.clip_high=-0.2", "algo.clip_high"),
    ("algo.dual_clip=1.0", "algo.dual_clip"),                 # with ppo_clip: the constant of dual_clip
    ("algo.policy_loss=dual_clip algo.dual_clip=1.0", "algo.dual_clip"),
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
    msg = _error(BANDIT, *override.split())
    assert f"'{key}'" in msg and override.split("=")[-1] in msg


def test_valid_edges_load():
    cfg = load_config(BANDIT, ["algo.filter.keep_frac=1.0", "algo.clip_low=0", "algo.best_worst_k=4",
                               "algo.policy_loss=dual_clip", "algo.dual_clip=3", "train.group_size=2",
                               "algo.best_worst_k=1"])
    assert cfg.algo.best_worst_k == 1 and cfg.train.group_size == 2


def test_renamed_key_names_the_new_one():
    msg = _error(BANDIT, "algo.best_of_n=2")
    assert "'algo.best_of_n'" in msg and "algo.best_worst_k" in msg


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_every_flat_algo_key_names_its_section_key(old, new):
    msg = _error(BANDIT, f"{old}=1")
    assert f"'{old}'" in msg and f"'{new}'" in msg


@pytest.mark.parametrize("key,value", [("algo.filter", "starpo"), ("algo.credit", "state"),
                                       ("algo.rollout_correction", "token_truncate")])
def test_a_name_given_where_a_section_now_is_names_the_section_key(key, value):
    msg = _error(BANDIT, f"{key}={value}")
    assert f"'{key}' is a section now" in msg and f"{SECTIONS[key]}={value}" in msg


@pytest.mark.integration
def test_the_cli_exits_2_naming_the_new_key(started):
    _, job = started["test_the_cli_exits_2_naming_the_new_key"]
    p = job.result()
    assert p.returncode == 2
    assert "'algo.nft_beta' moved into its algorithm's section: use 'algo.nft.beta'" in p.stderr
    assert "Traceback" not in p.stderr


def test_a_saved_config_of_the_flat_form_is_migrated():
    saved = {"seed": 1, "algo": {"filter": "starpo", "filter_keep_frac": 0.25, "credit": "state", "turn_gamma": 0.9,
                                 "nft_beta": 2.0, "rollout_correction": "token_mask", "rollout_correction_min": 0.5,
                                 "max_resample_rounds": 1, "kl_beta": 0.0}}
    assert migrate(saved) == {"seed": 1, "algo": {
        "filter": {"name": "starpo", "keep_frac": 0.25, "max_resample_rounds": 1},
        "credit": {"name": "state", "gamma": 0.9}, "nft": {"beta": 2.0},
        "rollout_correction": {"mode": "token_mask", "min": 0.5}, "kl_beta": 0.0}}
    assert migrate({"seed": 1}) == {"seed": 1}


@pytest.mark.integration
def test_a_run_saved_with_flat_keys_resumes_and_its_config_loads_for_export(started):
    """A run written before the sections were nested and before GSPO and GRPO-Guard were losses of their own:
    its config.yaml holds the flat keys and the flags ratio_level / ratio_norm."""
    folder, job = started["test_a_run_saved_with_flat_keys_resumes_and_its_config_loads_for_export"]
    run = folder / "run"
    common = _flat_keys_common(run)
    p = job.result()
    assert p.returncode == 0, p.stderr[-2000:]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    section = saved["algo"].pop("filter")
    assert section == {"name": "starpo", "keep_frac": 0.5, "max_resample_rounds": 3}
    saved["algo"].update(filter="starpo", filter_keep_frac=0.5, max_resample_rounds=3,     # the flat form
                         ratio_level="token", ratio_norm=False)
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    p = subprocess.run([sys.executable, "-m", "mmrl", "train", BANDIT, "max_steps=4", "resume=auto", *common],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "step 4" in p.stderr + p.stdout or (run / "checkpoints" / "step_000004").is_dir()
    (run / "config.yaml").write_text(yaml.safe_dump(saved))                               # what export reads
    cfg = load_config(str(run / "config.yaml"), [], saved=True)
    assert cfg.algo.filter == FilterConfig(name="starpo", keep_frac=0.5, max_resample_rounds=3)
    assert cfg.algo.policy_loss == "ppo_clip"


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
    msg = _error(BANDIT, "rewards=[{name: 'mmrl.testing.bandit:no_such_fn'}]")
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
    msg = _error(BANDIT, "data.train=mmrl.testing.bandit:nothing")
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
    from mmrl.loop.trainer import train

    adapter = tmp_path / "my_adapter.py"
    adapter.write_text(
        "from dataclasses import dataclass\n"
        "import mmrl.testing.bandit as base\n\n"
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
    msg = _error(BANDIT, "policy.name=mmrl.testing.bandit:match")
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
