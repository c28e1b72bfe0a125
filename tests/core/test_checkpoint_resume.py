"""Resuming from a checkpoint: what `resume` and `checkpoint.load` refuse and how they say so (a checkpoint of
another policy shape, missing files, a config that changes what is trained; the CLI through a subprocess where
the exit code is the contract), and the global RNG state a resume carries on."""

import dataclasses
import os
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch

from mmrl.config import ConfigError
from mmrl.loop.trainer import setup
from mmrl.state import checkpoint
from mmrl.state.checkpoint import IncompatibleCheckpoint
from mmrl.state.resume import changed_keys
from mmrl.testing.bandit import BanditPolicy


def _config_error(result, *needles):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    for n in needles:
        assert n in result.stderr, (n, result.stderr)


def _copied_checkpoint(run_bandit, tmp_path, *overrides) -> str:
    """A finished bandit run's last checkpoint, copied out of its run directory."""
    run_bandit(tmp_path / "src", "max_steps=2", *overrides)
    copy = tmp_path / "copies" / "ckpt"
    shutil.copytree(tmp_path / "src" / "checkpoints" / "step_000002", copy)
    return str(copy)


def _missing_optimizer(run_bandit, tmp_path) -> str:
    ckpt = _copied_checkpoint(run_bandit, tmp_path)
    os.remove(os.path.join(ckpt, "optimizer.pt"))
    return ckpt


def _finished_run(run_bandit, tmp_path) -> None:
    run_bandit(tmp_path, "max_steps=2")


# what each test below resumes from (made in process: a checkpoint or None) and the overrides of its `mmrl train`
# subprocess
REFUSALS = {
    "test_a_checkpoint_of_another_policy_shape_is_a_config_error":
        (_copied_checkpoint, lambda d, ckpt: [f"output_dir={d / 'new'}", "policy.num_arms=6", f"resume={ckpt}"]),
    "test_a_checkpoint_missing_files_is_a_config_error":
        (_missing_optimizer, lambda d, ckpt: [f"output_dir={d / 'new'}", f"resume={ckpt}"]),
    "test_resume_refuses_a_config_that_changes_what_is_trained":
        (_finished_run, lambda d, _: [f"output_dir={d}", "resume=auto", "max_steps=3", "seed=1", "optim.lr=0.2"]),
}


@pytest.fixture(scope="module", autouse=True)
def refused(tmp_path_factory, run_bandit, bandit_config, mmrl_cmd, in_background, selected):
    """{test name: (its folder, the checkpoint, Future of the CompletedProcess)}: for each selected test of
    REFUSALS, what it resumes from, then `mmrl train` of the tiny bandit config with its overrides through a
    subprocess, all started with the module's first test (they run side by side)."""
    jobs = {}
    for name, (make, overrides) in REFUSALS.items():
        if name in selected:
            folder = tmp_path_factory.mktemp(name[5:30])
            ckpt = make(run_bandit, folder)
            cmd = mmrl_cmd("train", bandit_config, *overrides(folder, ckpt))
            jobs[name] = folder, ckpt, in_background(subprocess.run, cmd, capture_output=True, text=True, timeout=120)
    return jobs


# ---------------------------------------------------------------- what resume refuses, and how it says so

@pytest.mark.integration
def test_a_checkpoint_of_another_policy_shape_is_a_config_error(bandit_cfg, refused):
    tmp_path, ckpt, cli = refused["test_a_checkpoint_of_another_policy_shape_is_a_config_error"]
    with pytest.raises(IncompatibleCheckpoint, match="does not match policy 'bandit'"):
        setup(bandit_cfg(tmp_path / "new", "policy.num_arms=6", f"resume={ckpt}"))
    _config_error(cli.result(), "configuration error", ckpt, "does not match policy 'bandit'", "size mismatch")


@pytest.mark.integration
def test_a_checkpoint_missing_files_is_a_config_error(bandit_cfg, refused):
    tmp_path, ckpt, cli = refused["test_a_checkpoint_missing_files_is_a_config_error"]
    _config_error(cli.result(), ckpt, "is missing optimizer.pt", "policy.safetensors")
    with pytest.raises(IncompatibleCheckpoint, match="looks like a run directory"):
        setup(bandit_cfg(tmp_path / "new", f"resume={tmp_path / 'src'}"))


@pytest.mark.integration
def test_resume_refuses_a_config_that_changes_what_is_trained(run_bandit, bandit_cfg, train_rows, refused):
    tmp_path, _, cli = refused["test_resume_refuses_a_config_that_changes_what_is_trained"]
    _config_error(cli.result(), "optim.lr", "seed", str(tmp_path / "config.yaml"), "another output_dir")
    with pytest.raises(ConfigError, match=r"policy\.num_actions"):
        setup(bandit_cfg(tmp_path, "resume=auto", "policy.num_actions=3"))
    # how long, where and what to report may change
    run_bandit(tmp_path, "resume=auto", "max_steps=3", "eval.every=1", "checkpoint.every=1", "checkpoint.keep_last=1",
               "logging.save_samples_every=1", "optim.max_nonfinite_in_a_row=5")
    assert [r["step"] for r in train_rows(tmp_path)] == [1, 2, 3]


def test_missing_files_are_listed_and_a_run_directory_gets_a_hint(tmp_path, save_bandit, bandit_objects):
    """A folder missing checkpoint files names each missing one and the full set; only a folder with a
    `checkpoints/` inside (a run directory) gets the resume hint."""
    path = save_bandit(tmp_path / "run" / "checkpoints", 2)
    for name in ("optimizer.pt", "rng.pt"):
        os.remove(os.path.join(path, name))
    holds = "an mmrl checkpoint folder holds policy.safetensors, optimizer.pt, scheduler.pt, rng.pt, state.json"
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as err:
        checkpoint.load(path, *bandit_objects(0.0))
    assert str(err.value) == (f"config key 'resume': checkpoint {path!r} is missing optimizer.pt, rng.pt; {holds}")
    run = str(tmp_path / "run")
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as err:
        checkpoint.load(run, *bandit_objects(0.0))
    assert str(err.value).endswith(f"{holds}; {run!r} looks like a run directory: pass output_dir={run} "
                                   f"resume=auto, or resume={run}/checkpoints/step_<n>")


@pytest.mark.parametrize("length", [400, 401])
def test_a_mismatch_message_keeps_400_characters_of_the_cause(tmp_path, monkeypatch, length, save_bandit,
                                                              bandit_objects):
    """The library's reason for a mismatch is quoted whole up to 400 characters, cut with '...' beyond."""
    path = save_bandit(tmp_path, 2)
    cause = "x" * (length - 3) + "\n  yy"       # whitespace runs (a multi-line torch error) become one space

    def refuse(self, p):
        raise RuntimeError(cause)

    monkeypatch.setattr(BanditPolicy, "load", refuse)
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as err:
        checkpoint.load(path, *bandit_objects(0.0))
    flat = "x" * (length - 3) + " yy"                                           # `length` characters
    quoted = flat if length <= 400 else flat[:400] + "..."
    assert str(err.value) == (f"config key 'resume': checkpoint {path!r} does not match policy 'bandit' of "
                              f"this run: {quoted}. Resume it with the policy section it was trained with (its "
                              "run's config.yaml), or start a new run in another output_dir")


def test_changed_keys_compares_nested_sections_and_skips_keys_one_side_lacks():
    saved = {"seed": 0, "max_steps": 2, "eval": {"every": 1}, "policy": {"name": "bandit", "num_arms": 8},
             "rewards": [{"name": "a"}], "algo": {"old_key": 1}}
    new = {"seed": 0, "max_steps": 9, "eval": {"every": 5}, "policy": {"name": "bandit", "num_arms": 6},
           "rewards": [{"name": "b"}], "algo": {"new_key": 2}}
    assert changed_keys(saved, new) == ["policy.num_arms", "rewards"]


def test_policy_name_in_errors_names_the_policy_and_its_model():
    """The incompatible-checkpoint message names the policy: its config's name and model, the name alone
    when the config has no model, and the class name when there is no config."""
    class WithModel:
        cfg = type("Cfg", (), {"name": "vlm", "model": "Qwen/Qwen2.5-VL-3B-Instruct"})()

    class NoModel:
        cfg = type("Cfg", (), {"name": "bandit"})()

    class Bare:
        pass

    assert checkpoint._policy_name(WithModel()) == "'vlm' (model Qwen/Qwen2.5-VL-3B-Instruct)"
    assert checkpoint._policy_name(NoModel()) == "'bandit'"
    assert checkpoint._policy_name(Bare()) == "'Bare'"


# ---------------------------------------------------------------- global RNG state across a resume

_BANDIT_ROLLOUT = BanditPolicy.rollout


def _globally_seeded(draws: list):
    """A bandit rollout whose prompt seeds come from the global torch, numpy and python RNGs (as a
    policy that calls torch.rand / torch.multinomial without a generator): what it samples, and so
    the whole training curve, depends on the global RNG state. Each step's draws go to `draws`."""
    def noisy(self, prompts, group_size):
        seeds = [int(torch.randint(0, 2**31, ())) ^ random.getrandbits(31) ^ int(np.random.randint(0, 2**31))
                 for _ in prompts.seeds]
        draws.append((prompts.step, seeds))
        return _BANDIT_ROLLOUT(self, dataclasses.replace(prompts, seeds=seeds), group_size)

    return noisy


def _without_time(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/peak_"))} for r in rows]


def test_resume_restores_the_global_rng_draws(tmp_path, monkeypatch, run_bandit, train_rows):
    """Save at step 3, keep drawing to step 6 (the run that is then lost), resume from step 3: steps
    4..6 draw exactly what the uninterrupted run drew and train to the same metrics. Without the RNG
    restore the resumed run would draw from the freshly seeded state instead."""
    first, resumed = [], []
    monkeypatch.setattr(BanditPolicy, "rollout", _globally_seeded(first))
    run_bandit(tmp_path, "max_steps=6", "checkpoint.every=3", "eval.every=0")
    full = _without_time(train_rows(tmp_path))
    assert [step for step, _ in first] == [0, 1, 2, 3, 4, 5]
    assert len({tuple(s) for _, s in first}) == 6                     # every step draws anew

    root = tmp_path / "checkpoints"                                    # lose what came after step 3
    shutil.rmtree(root / "step_000006")
    (root / "latest").write_text("step_000003\n")
    random.random(), np.random.rand(), torch.rand(3)                   # and draw some more meanwhile
    monkeypatch.setattr(BanditPolicy, "rollout", _globally_seeded(resumed))
    run_bandit(tmp_path, "max_steps=6", "checkpoint.every=3", "eval.every=0", "resume=auto")

    assert resumed == first[3:]
    again = _without_time(train_rows(tmp_path))
    assert len(again) == len(full) == 6
    assert again == full


def test_rng_state_carries_the_cuda_generators_when_cuda_is_there(monkeypatch):
    """With CUDA (faked here: no GPU on the test machine) the state holds every device's generator and a
    restore hands exactly those back; a state saved without CUDA restores without touching CUDA."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["gpu0", "gpu1"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", calls.append)
    state = checkpoint.rng_state()
    assert state["cuda"] == ["gpu0", "gpu1"]
    checkpoint.set_rng_state(state)
    assert calls == [["gpu0", "gpu1"]]
    del state["cuda"]
    checkpoint.set_rng_state(state)
    assert calls == [["gpu0", "gpu1"]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    checkpoint.set_rng_state({**state, "cuda": ["gpu0"]})       # saved on a GPU machine, resumed on a CPU one
    assert calls == [["gpu0", "gpu1"]]
