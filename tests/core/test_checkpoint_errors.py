"""Checkpoint error paths on the bandit policy: a failed write, leftovers of killed writes, and
`resume` pointing at a checkpoint this run cannot continue from (the CLI through a subprocess
where the exit code is the contract)."""

import errno
import os
import shutil
import subprocess
import sys

import pytest
import torch

from testkit import BANDIT, mmrl_cmd
from helpers import bandit_cfg, run_bandit, train_rows
from mmrl.state import checkpoint
from mmrl.state.checkpoint import CheckpointError, IncompatibleCheckpoint
from mmrl.config import ConfigError
from mmrl.state.resume import changed_keys
from mmrl.loop.trainer import setup


def cli(*args):
    return subprocess.run(mmrl_cmd("train", BANDIT, *args), capture_output=True, text=True, timeout=120)


def _config_error(result, *needles):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    for n in needles:
        assert n in result.stderr, (n, result.stderr)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _refuse_step(monkeypatch, step: int, error: Exception):
    """Make torch.save fail while checkpoint `step` is written (a full disk, in effect)."""
    real = torch.save

    def save(obj, path, *a, **k):
        if f"step_{step:06d}" in str(path):
            raise error
        return real(obj, path, *a, **k)

    monkeypatch.setattr(torch, "save", save)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                   RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")])
def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch, error):
    _refuse_step(monkeypatch, 4, error)
    root = str(tmp_path / "checkpoints")
    with pytest.raises(CheckpointError) as e:
        run_bandit(tmp_path, "max_steps=4", "checkpoint.every=2")
    message = str(e.value)
    assert root in message and "step_000004" in message and "step_000002" in message and "intact" in message
    assert (os.strerror(errno.ENOSPC) if isinstance(error, OSError) else "file write failed") in message
    assert sorted(os.listdir(root)) == ["latest", "step_000002"]  # the partial write is gone
    monkeypatch.undo()
    run = setup(bandit_cfg(tmp_path, "max_steps=4", "resume=auto"))
    assert run.start_step == 2


def test_a_failed_write_stops_the_cli_with_exit_code_1(tmp_path):
    script = ("import errno, os, sys, torch\n"
              "real = torch.save\n"
              "def save(obj, path, *a, **k):\n"
              "    if 'step_000002' in str(path):\n"
              "        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))\n"
              "    return real(obj, path, *a, **k)\n"
              "torch.save = save\n"
              "from mmrl.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    out = subprocess.run([sys.executable, "-c", script, "train", BANDIT, f"output_dir={tmp_path}", "max_steps=2",
                          "checkpoint.every=1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    for needle in ("training stopped", "cannot write checkpoint step_000002", str(tmp_path / "checkpoints"),
                   "No space left on device", "step_000001"):
        assert needle in out.stderr, (needle, out.stderr)


def test_a_run_clears_what_killed_writes_left(tmp_path):
    run_bandit(tmp_path, "max_steps=2", "checkpoint.every=1")
    root, dead, alive = tmp_path / "checkpoints", _dead_pid(), os.getppid()
    (root / f"latest.tmp-{dead}").write_text("step_000002\n")
    (tmp_path / f"metrics.jsonl.tmp-{dead}").write_text("{}\n")
    os.makedirs(root / f".tmp_step_000003_{dead}")
    shutil.copytree(root / "step_000002", root / f"step_000002.old_{dead}")   # its step is there: removed
    os.rename(root / "step_000001", root / f"step_000001.old_{dead}")          # its step is missing: put back
    (root / f"latest.tmp-{alive}").write_text("a live process may still write this\n")

    run_bandit(tmp_path, "max_steps=3", "checkpoint.every=1", "resume=auto")
    assert [r["step"] for r in train_rows(tmp_path)] == [1, 2, 3]
    assert sorted(os.listdir(root)) == ["latest", f"latest.tmp-{alive}", "step_000002", "step_000003"]
    assert f"metrics.jsonl.tmp-{dead}" not in os.listdir(tmp_path)


def test_clean_stale_puts_back_a_step_moved_aside(tmp_path):
    dead = _dead_pid()
    os.makedirs(tmp_path / f"step_000005.old_{dead}")
    (tmp_path / f"step_000005.old_{dead}" / "state.json").write_text("{}")
    (tmp_path / "notes.tmp-x").write_text("not a temporary of ours")
    assert checkpoint.clean_stale(str(tmp_path)) == [f"step_000005.old_{dead}"]
    assert sorted(os.listdir(tmp_path)) == ["notes.tmp-x", "step_000005"]
    assert os.path.isfile(tmp_path / "step_000005" / "state.json")


def _copied_checkpoint(tmp_path, *overrides) -> str:
    """A finished bandit run's last checkpoint, copied out of its run directory."""
    run_bandit(tmp_path / "src", "max_steps=2", *overrides)
    copy = tmp_path / "copies" / "ckpt"
    shutil.copytree(tmp_path / "src" / "checkpoints" / "step_000002", copy)
    return str(copy)


def test_a_checkpoint_of_another_policy_shape_is_a_config_error(tmp_path):
    ckpt = _copied_checkpoint(tmp_path)
    with pytest.raises(IncompatibleCheckpoint, match="does not match policy 'bandit'"):
        setup(bandit_cfg(tmp_path / "new", "policy.num_arms=6", f"resume={ckpt}"))
    _config_error(cli(f"output_dir={tmp_path / 'new'}", "policy.num_arms=6", f"resume={ckpt}"),
                  "configuration error", ckpt, "does not match policy 'bandit'", "size mismatch")


def test_a_checkpoint_missing_files_is_a_config_error(tmp_path):
    ckpt = _copied_checkpoint(tmp_path)
    os.remove(os.path.join(ckpt, "optimizer.pt"))
    _config_error(cli(f"output_dir={tmp_path / 'new'}", f"resume={ckpt}"),
                  ckpt, "is missing optimizer.pt", "policy.safetensors")
    with pytest.raises(IncompatibleCheckpoint, match="looks like a run directory"):
        setup(bandit_cfg(tmp_path / "new", f"resume={tmp_path / 'src'}"))


def test_resume_refuses_a_config_that_changes_what_is_trained(tmp_path):
    run_bandit(tmp_path, "max_steps=2")
    _config_error(cli(f"output_dir={tmp_path}", "resume=auto", "max_steps=3", "seed=1", "optim.lr=0.2"),
                  "optim.lr", "seed", str(tmp_path / "config.yaml"), "another output_dir")
    with pytest.raises(ConfigError, match=r"policy\.num_actions"):
        setup(bandit_cfg(tmp_path, "resume=auto", "policy.num_actions=3"))
    # how long, where and what to report may change
    run_bandit(tmp_path, "resume=auto", "max_steps=3", "eval.every=1", "checkpoint.every=1", "checkpoint.keep_last=1",
               "logging.save_samples_every=1", "optim.max_nonfinite_in_a_row=5")
    assert [r["step"] for r in train_rows(tmp_path)] == [1, 2, 3]


def test_changed_keys_compares_nested_sections_and_skips_keys_one_side_lacks():
    saved = {"seed": 0, "max_steps": 2, "eval": {"every": 1}, "policy": {"name": "bandit", "num_arms": 8},
             "rewards": [{"name": "a"}], "algo": {"old_key": 1}}
    new = {"seed": 0, "max_steps": 9, "eval": {"every": 5}, "policy": {"name": "bandit", "num_arms": 6},
           "rewards": [{"name": "b"}], "algo": {"new_key": 2}}
    assert changed_keys(saved, new) == ["policy.num_arms", "rewards"]


def test_writer_alive_answers_for_each_kind_of_pid(monkeypatch):
    """Who may still be writing: not this process, not pid 0 (signal 0 to it would reach our own process
    group) or a negative pid; pid 1 (init, always alive) yes; a pid the kernel cannot hold (OverflowError)
    or a dead one no; a live process of another user (PermissionError) yes; on Windows always yes."""
    assert not checkpoint._writer_alive(os.getpid())
    assert not checkpoint._writer_alive(0) and not checkpoint._writer_alive(-5)
    assert checkpoint._writer_alive(1)
    assert not checkpoint._writer_alive(2 ** 80)
    assert not checkpoint._writer_alive(_dead_pid())

    def denied(pid, sig):
        raise PermissionError(errno.EPERM, "not ours")

    dead = _dead_pid()
    with monkeypatch.context() as m:
        m.setattr(checkpoint.os, "name", "nt")
        assert checkpoint._writer_alive(dead)        # never probed there (the real probe would say: dead)
    monkeypatch.setattr(checkpoint.os, "kill", denied)
    assert checkpoint._writer_alive(dead)


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


def test_clean_stale_goes_on_after_a_temporary_it_cannot_put_back(tmp_path, monkeypatch):
    """A rename that fails (another process got there first) skips that temporary, not the rest."""
    dead = _dead_pid()
    for step in (5, 6):
        os.makedirs(tmp_path / f"step_00000{step}.old_{dead}")
    real = os.rename

    def rename(src, dst):
        if "step_000005" in str(src):
            raise OSError(errno.EEXIST, "taken")
        return real(src, dst)

    monkeypatch.setattr(checkpoint.os, "rename", rename)
    assert checkpoint.clean_stale(str(tmp_path)) == [f"step_000006.old_{dead}"]
    assert sorted(os.listdir(tmp_path)) == [f"step_000005.old_{dead}", "step_000006"]
