"""Writing a checkpoint when something goes wrong: a failed write keeps the previous checkpoint, killed writes
leave nothing that passes for a checkpoint and their leftovers are cleaned, and a `latest` pointer that names no
checkpoint falls back to the highest step.

Each injected failure hits one point of the write (the state writers, the fsync, the rename of the
temporary folder into place, the write of the `latest` pointer); afterwards the previous checkpoint
must still be what `checkpoint.latest` returns, load with its own step and weights, and no
half-written folder may pass for a complete checkpoint. A failed write stops the CLI with exit code 1
(through a subprocess, where the exit code is the contract; started with the module's first test, beside
the in-process ones)."""

import errno
import io
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from mmrl.loop.trainer import setup
from mmrl.state import checkpoint
from mmrl.state.checkpoint import CheckpointError
from mmrl.testing.bandit import BanditPolicy

STEP2, STEP4 = "step_000002", "step_000004"


@pytest.fixture
def assert_loads(bandit_objects):
    """`assert_loads(path, step, value)`: the checkpoint at `path` loads with that step and all logits `value`."""
    def check(path, step: int, value: float) -> None:
        policy, optimizer, scheduler = bandit_objects(-1.0)
        state = checkpoint.load(str(path), policy, optimizer, scheduler)
        assert state["step"] == step and state["tag"] == f"theta {value}", state
        assert bool((policy.net.theta == value).all()), policy.net.theta

    return check


def _pointer(root) -> str:
    return (root / "latest").read_text()


def _assert_every_complete_checkpoint_loads(root, bandit_objects) -> None:
    """No folder that `complete` lists is a half-written one: each loads, with the step of its name."""
    for path in checkpoint.complete(str(root)):
        step = int(os.path.basename(path)[len(checkpoint.PREFIX):])
        policy, optimizer, scheduler = bandit_objects(-1.0)
        assert checkpoint.load(path, policy, optimizer, scheduler)["step"] == step, path


class _FailingWrites(io.StringIO):
    """A text file that takes a few characters, then reports a full disk."""

    def __init__(self, real):
        super().__init__()
        self.real = real

    def write(self, text):
        self.real.write(text[:3])
        self.real.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fileno(self):
        return self.real.fileno()

    def __exit__(self, *exc):
        self.real.close()
        return False


def _inject(monkeypatch, point: str, root, exc: BaseException) -> None:
    """Make the write of checkpoint 4 under `root` fail with `exc` at `point`."""
    tmp_name = f".tmp_{STEP4}_{os.getpid()}"
    if point == "policy weights":
        def save(self, path):
            raise exc
        monkeypatch.setattr(BanditPolicy, "save", save)
    elif point == "rng state":
        real = torch.save

        def torch_save(obj, path, *a, **k):
            if str(path).endswith("rng.pt") and tmp_name in str(path):
                raise exc
            return real(obj, path, *a, **k)
        monkeypatch.setattr(torch, "save", torch_save)
    elif point == "trainer state":
        real_dump = json.dump

        def dump(obj, f, *a, **k):
            if obj.get("step") == 4:
                f.write('{"step": 4, ')          # a truncated state.json
                raise exc
            return real_dump(obj, f, *a, **k)
        monkeypatch.setattr(json, "dump", dump)
    elif point == "fsync of the written files":
        def fsync(fd):
            raise exc
        monkeypatch.setattr(os, "fsync", fsync)
    elif point == "rename into place":
        real_rename = os.rename

        def rename(src, dst):
            if os.path.basename(str(src)) == tmp_name:
                raise exc
            return real_rename(src, dst)
        monkeypatch.setattr(os, "rename", rename)
    elif point == "pointer write":
        real_open = open

        def fake_open(path, mode="r", *a, **k):
            f = real_open(path, mode, *a, **k)
            return _FailingWrites(f) if os.path.basename(str(path)).startswith("latest.tmp-") else f
        monkeypatch.setattr(checkpoint, "open", fake_open, raising=False)   # shadows the builtin there
    elif point == "pointer replace":
        real_replace = os.replace

        def replace(src, dst):
            if os.path.basename(str(dst)) == "latest":
                raise exc
            return real_replace(src, dst)
        monkeypatch.setattr(os, "replace", replace)
    else:
        raise AssertionError(point)


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


# ---------------------------------------------------------------- a failed write

BEFORE_RENAME = ["policy weights", "rng state", "trainer state", "fsync of the written files", "rename into place"]
POINTER = ["pointer write", "pointer replace"]


@pytest.mark.parametrize("point", BEFORE_RENAME + POINTER)
def test_a_failed_save_leaves_the_previous_checkpoint_latest(tmp_path, monkeypatch, point, save_bandit, assert_loads,
                                                             bandit_objects):
    """A write of step 4 that fails at `point` raises CheckpointError; step 2 stays the `latest`, loads
    with its step and weights, the pointer file still names it, and no temporary is left behind."""
    root = tmp_path / "checkpoints"
    save_bandit(root, 2)
    _inject(monkeypatch, point, root, OSError(errno.EIO, os.strerror(errno.EIO)))
    with pytest.raises(CheckpointError, match=rf"cannot write checkpoint {STEP4}.*{STEP2}.*intact") as err:
        save_bandit(root, 4)
    monkeypatch.undo()
    # the message says what happened to step 4: removed, or complete with the pointer left behind
    said = "itself is complete, but the 'latest' pointer" if point in POINTER else "The partial write was removed"
    assert said in str(err.value)

    assert _pointer(root) == f"{STEP2}\n"
    assert checkpoint.latest(str(root)) == str(root / STEP2)
    assert_loads(checkpoint.latest(str(root)), 2, 2)
    # before the rename nothing of step 4 may remain; after it, step 4 is whole (renamed complete)
    expected = ["latest", STEP2] + ([STEP4] if point in POINTER else [])
    assert sorted(os.listdir(root)) == expected
    _assert_every_complete_checkpoint_loads(root, bandit_objects)

    save_bandit(root, 4)                                   # the next attempt succeeds and moves the pointer
    assert _pointer(root) == f"{STEP4}\n" and checkpoint.latest(str(root)) == str(root / STEP4)
    assert_loads(root / STEP4, 4, 4)


def test_a_failed_rename_over_an_existing_step_puts_the_old_one_back(tmp_path, monkeypatch, save_bandit, assert_loads):
    """Saving step 4 again (after a resume) moves the old step 4 aside; when the rename of the new one
    fails, the old one is renamed back: step 4 with its old weights stays the latest."""
    root = tmp_path / "checkpoints"
    save_bandit(root, 2)
    save_bandit(root, 4)
    _inject(monkeypatch, "rename into place", root, OSError(errno.EIO, os.strerror(errno.EIO)))
    with pytest.raises(CheckpointError, match=STEP4):
        save_bandit(root, 4, value=5)
    monkeypatch.undo()
    assert sorted(os.listdir(root)) == ["latest", STEP2, STEP4]
    assert checkpoint.latest(str(root)) == str(root / STEP4)
    assert_loads(root / STEP4, 4, 4)


def test_a_weights_write_error_names_the_file_and_saving_a_step_again_leaves_nothing_aside(tmp_path, monkeypatch,
                                                                                           save_bandit, assert_loads):
    """safetensors' own write error becomes a CheckpointError naming the weights file being written; saving
    an existing step again (after a resume) replaces it and leaves no `.old_` folder behind."""
    from safetensors import SafetensorError

    root = tmp_path / "checkpoints"
    save_bandit(root, 2)

    def full(self, path):
        raise SafetensorError("No space left on device")

    with monkeypatch.context() as m:
        m.setattr(BanditPolicy, "save", full)
        with pytest.raises(CheckpointError) as err:
            save_bandit(root, 4)
    tmp_weights = os.path.join(str(root), f".tmp_{STEP4}_{os.getpid()}", "policy.safetensors")
    assert f"cannot write {tmp_weights!r}: No space left on device" in str(err.value)
    save_bandit(root, 2, value=7.0)
    assert sorted(os.listdir(root)) == ["latest", STEP2]
    assert_loads(root / STEP2, 2, 7.0)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                   RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")])
def test_a_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch, error, run_bandit, bandit_cfg):
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


FAILING_SAVE = ("import errno, os, sys, torch\n"
               "real = torch.save\n"
               "def save(obj, path, *a, **k):\n"
               "    if 'step_000002' in str(path):\n"
               "        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))\n"
               "    return real(obj, path, *a, **k)\n"
               "torch.save = save\n"
               "from mmrl.cli import main\n"
               "sys.exit(main(sys.argv[1:]))\n")


@pytest.fixture(scope="module", autouse=True)
def failed_write(tmp_path_factory, bandit_config, in_background, selected):
    """(output directory, Future of the CompletedProcess) of the CLI whose second checkpoint write fails, when its
    test is selected: started with the module's first test, it runs beside the in-process tests before it."""
    if "test_a_failed_write_stops_the_cli_with_exit_code_1" not in selected:
        return None
    out = tmp_path_factory.mktemp("failed_write")
    cmd = [sys.executable, "-c", FAILING_SAVE, "train", bandit_config, f"output_dir={out}", "max_steps=2",
           "checkpoint.every=1"]
    return out, in_background(subprocess.run, cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_a_failed_write_stops_the_cli_with_exit_code_1(failed_write):
    tmp_path, job = failed_write
    out = job.result()
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    for needle in ("training stopped", "cannot write checkpoint step_000002", str(tmp_path / "checkpoints"),
                   "No space left on device", "step_000001"):
        assert needle in out.stderr, (needle, out.stderr)


# ---------------------------------------------------------------- a killed write and what it leaves

@pytest.mark.parametrize("point", ["rng state", "trainer state", "rename into place"])
def test_a_kill_mid_write_leaves_no_complete_looking_folder(tmp_path, monkeypatch, point, save_bandit, assert_loads):
    """A write interrupted without cleanup (KeyboardInterrupt stands for a kill) leaves only a
    `.tmp_` folder, which `complete` and `latest` ignore and `clean_stale` removes."""
    root = tmp_path / "checkpoints"
    save_bandit(root, 2)
    _inject(monkeypatch, point, root, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        save_bandit(root, 4)
    monkeypatch.undo()
    assert sorted(os.listdir(root)) == [f".tmp_{STEP4}_{os.getpid()}", "latest", STEP2]
    assert checkpoint.complete(str(root)) == [str(root / STEP2)]
    assert checkpoint.latest(str(root)) == str(root / STEP2)
    assert checkpoint.clean_stale(str(root)) == [f".tmp_{STEP4}_{os.getpid()}"]
    assert sorted(os.listdir(root)) == ["latest", STEP2]
    assert_loads(checkpoint.latest(str(root)), 2, 2)


def test_a_kill_between_the_two_renames_is_undone_by_clean_stale(tmp_path, monkeypatch, save_bandit, assert_loads):
    """Re-saving step 4, a kill after the old step 4 was moved aside and before the new one is in
    place: `latest` still gives a complete checkpoint, and `clean_stale` puts the old step 4 back."""
    root = tmp_path / "checkpoints"
    save_bandit(root, 2)
    save_bandit(root, 4)
    _inject(monkeypatch, "rename into place", root, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        save_bandit(root, 4, value=5)
    monkeypatch.undo()
    assert STEP4 not in os.listdir(root)
    assert checkpoint.latest(str(root)) == str(root / STEP2)          # the pointer's target is missing
    checkpoint.clean_stale(str(root))
    assert sorted(os.listdir(root)) == ["latest", STEP2, STEP4]
    assert checkpoint.latest(str(root)) == str(root / STEP4)
    assert_loads(root / STEP4, 4, 4)


def test_a_run_clears_what_killed_writes_left(tmp_path, run_bandit, train_rows):
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


def test_keep_last_prunes_old_steps_and_killed_writes_of_other_processes(tmp_path, monkeypatch, bandit_objects):
    """save keeps the newest `keep_last` steps (2 by default, at least 1) and removes `.tmp_` leftovers of
    other processes, never a temporary of its own process; a first write that fails says no earlier
    checkpoint exists."""
    root = tmp_path / "checkpoints"
    objs = bandit_objects(1.0)
    for step in (1, 2, 3):
        checkpoint.save(str(root), step, *objs, {})
    assert sorted(os.listdir(root)) == ["latest", "step_000002", "step_000003"]
    os.makedirs(root / ".tmp_step_000009_999999")                        # a killed writer's leftover
    os.makedirs(root / f".tmp_mine_{os.getpid()}")                        # this process's: kept
    checkpoint.save(str(root), 4, *objs, {}, keep_last=1)
    assert sorted(os.listdir(root)) == [f".tmp_mine_{os.getpid()}", "latest", "step_000004"]
    checkpoint.save(str(root), 5, *objs, {}, keep_last=0)
    assert sorted(os.listdir(root)) == [f".tmp_mine_{os.getpid()}", "latest", "step_000005"]

    def refuse(self, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(BanditPolicy, "save", refuse)
    with pytest.raises(CheckpointError) as err:
        checkpoint.save(str(tmp_path / "fresh"), 1, *objs, {})
    assert str(err.value).endswith(". The partial write was removed; no earlier checkpoint exists. Free disk "
                                   "space or make the folder writable, then run again")


# ---------------------------------------------------------------- a pointer that names no checkpoint

@pytest.mark.parametrize("content", ["", "\n", "  \n", ".", "./", "..", "../x", "x", f"{STEP2}/..", "/",
                                     "step_", "step_abc", "step_000009"])
def test_a_pointer_naming_no_step_folder_falls_back_to_the_highest_step(tmp_path, content, save_bandit):
    """An empty `latest` file, or one naming anything but an existing `step_<digits>` folder, never
    makes `latest` return the run's own folder (or one outside it): it falls back to the highest
    complete step."""
    root = tmp_path / "run" / "checkpoints"
    save_bandit(root, 2)
    save_bandit(root, 4)
    os.makedirs(tmp_path / "run" / "x")              # "../x" names an existing folder
    (root / "latest").write_text(content)
    assert checkpoint.latest(str(root)) == str(root / STEP4)


@pytest.mark.parametrize("content", ["", ".", "../x"])
def test_a_pointer_naming_no_step_folder_and_no_steps_gives_none(tmp_path, content):
    """With no complete step at all, a bad pointer gives None (a new run), not the folder itself."""
    root = tmp_path / "run" / "checkpoints"
    os.makedirs(root)
    os.makedirs(tmp_path / "run" / "x")
    (root / "latest").write_text(content)
    assert checkpoint.latest(str(root)) is None
