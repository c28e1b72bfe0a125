"""Failures injected inside `checkpoint.save`, a `latest` pointer that names no checkpoint, and the
global RNG state carried across a resume.

Each injected failure hits one point of the write (the state writers, the fsync, the rename of the
temporary folder into place, the write of the `latest` pointer); afterwards the previous checkpoint
must still be what `checkpoint.latest` returns, load with its own step and weights, and no
half-written folder may pass for a complete checkpoint."""

import dataclasses
import errno
import io
import json
import os
import random
import shutil

import numpy as np
import pytest
import torch

from helpers import run_bandit, train_rows
from mmrl.state import checkpoint
from mmrl.testing.bandit import BanditPolicy, Config as BanditConfig
from mmrl.state.checkpoint import CheckpointError

STEP2, STEP4 = "step_000002", "step_000004"


# ---------------------------------------------------------------- direct save / load of a bandit

def _objects(value: float):
    """A bandit policy whose logits are all `value`, with its optimizer and scheduler."""
    policy = BanditPolicy(BanditConfig(), torch.device("cpu"))
    with torch.no_grad():
        policy.net.theta.fill_(value)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=0.1)
    return policy, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)


def _save(root, step: int, value: float | None = None) -> str:
    return checkpoint.save(str(root), step, *_objects(step if value is None else value),
                           {"tag": f"theta {step if value is None else value}"}, keep_last=5)


def _assert_loads(path, step: int, value: float) -> None:
    policy, optimizer, scheduler = _objects(-1.0)
    state = checkpoint.load(str(path), policy, optimizer, scheduler)
    assert state["step"] == step and state["tag"] == f"theta {value}", state
    assert bool((policy.net.theta == value).all()), policy.net.theta


def _pointer(root) -> str:
    return (root / "latest").read_text()


def _assert_every_complete_checkpoint_loads(root) -> None:
    """No folder that `complete` lists is a half-written one: each loads, with the step of its name."""
    for path in checkpoint.complete(str(root)):
        step = int(os.path.basename(path)[len(checkpoint.PREFIX):])
        policy, optimizer, scheduler = _objects(-1.0)
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


BEFORE_RENAME = ["policy weights", "rng state", "trainer state", "fsync of the written files", "rename into place"]
POINTER = ["pointer write", "pointer replace"]


@pytest.mark.parametrize("point", BEFORE_RENAME + POINTER)
def test_a_failed_save_leaves_the_previous_checkpoint_latest(tmp_path, monkeypatch, point):
    """A write of step 4 that fails at `point` raises CheckpointError; step 2 stays the `latest`, loads
    with its step and weights, the pointer file still names it, and no temporary is left behind."""
    root = tmp_path / "checkpoints"
    _save(root, 2)
    _inject(monkeypatch, point, root, OSError(errno.EIO, os.strerror(errno.EIO)))
    with pytest.raises(CheckpointError, match=rf"cannot write checkpoint {STEP4}.*{STEP2}.*intact") as err:
        _save(root, 4)
    monkeypatch.undo()
    # the message says what happened to step 4: removed, or complete with the pointer left behind
    said = "itself is complete, but the 'latest' pointer" if point in POINTER else "The partial write was removed"
    assert said in str(err.value)

    assert _pointer(root) == f"{STEP2}\n"
    assert checkpoint.latest(str(root)) == str(root / STEP2)
    _assert_loads(checkpoint.latest(str(root)), 2, 2)
    # before the rename nothing of step 4 may remain; after it, step 4 is whole (renamed complete)
    expected = ["latest", STEP2] + ([STEP4] if point in POINTER else [])
    assert sorted(os.listdir(root)) == expected
    _assert_every_complete_checkpoint_loads(root)

    _save(root, 4)                                   # the next attempt succeeds and moves the pointer
    assert _pointer(root) == f"{STEP4}\n" and checkpoint.latest(str(root)) == str(root / STEP4)
    _assert_loads(root / STEP4, 4, 4)


def test_a_failed_rename_over_an_existing_step_puts_the_old_one_back(tmp_path, monkeypatch):
    """Saving step 4 again (after a resume) moves the old step 4 aside; when the rename of the new one
    fails, the old one is renamed back: step 4 with its old weights stays the latest."""
    root = tmp_path / "checkpoints"
    _save(root, 2)
    _save(root, 4)
    _inject(monkeypatch, "rename into place", root, OSError(errno.EIO, os.strerror(errno.EIO)))
    with pytest.raises(CheckpointError, match=STEP4):
        _save(root, 4, value=5)
    monkeypatch.undo()
    assert sorted(os.listdir(root)) == ["latest", STEP2, STEP4]
    assert checkpoint.latest(str(root)) == str(root / STEP4)
    _assert_loads(root / STEP4, 4, 4)


@pytest.mark.parametrize("point", ["rng state", "trainer state", "rename into place"])
def test_a_kill_mid_write_leaves_no_complete_looking_folder(tmp_path, monkeypatch, point):
    """A write interrupted without cleanup (KeyboardInterrupt stands for a kill) leaves only a
    `.tmp_` folder, which `complete` and `latest` ignore and `clean_stale` removes."""
    root = tmp_path / "checkpoints"
    _save(root, 2)
    _inject(monkeypatch, point, root, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _save(root, 4)
    monkeypatch.undo()
    assert sorted(os.listdir(root)) == [f".tmp_{STEP4}_{os.getpid()}", "latest", STEP2]
    assert checkpoint.complete(str(root)) == [str(root / STEP2)]
    assert checkpoint.latest(str(root)) == str(root / STEP2)
    assert checkpoint.clean_stale(str(root)) == [f".tmp_{STEP4}_{os.getpid()}"]
    assert sorted(os.listdir(root)) == ["latest", STEP2]
    _assert_loads(checkpoint.latest(str(root)), 2, 2)


def test_a_kill_between_the_two_renames_is_undone_by_clean_stale(tmp_path, monkeypatch):
    """Re-saving step 4, a kill after the old step 4 was moved aside and before the new one is in
    place: `latest` still gives a complete checkpoint, and `clean_stale` puts the old step 4 back."""
    root = tmp_path / "checkpoints"
    _save(root, 2)
    _save(root, 4)
    _inject(monkeypatch, "rename into place", root, KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _save(root, 4, value=5)
    monkeypatch.undo()
    assert STEP4 not in os.listdir(root)
    assert checkpoint.latest(str(root)) == str(root / STEP2)          # the pointer's target is missing
    checkpoint.clean_stale(str(root))
    assert sorted(os.listdir(root)) == ["latest", STEP2, STEP4]
    assert checkpoint.latest(str(root)) == str(root / STEP4)
    _assert_loads(root / STEP4, 4, 4)


# ---------------------------------------------------------------- a pointer that names no checkpoint

@pytest.mark.parametrize("content", ["", "\n", "  \n", ".", "./", "..", "../x", "x", f"{STEP2}/..", "/",
                                     "step_", "step_abc", "step_000009"])
def test_a_pointer_naming_no_step_folder_falls_back_to_the_highest_step(tmp_path, content):
    """An empty `latest` file, or one naming anything but an existing `step_<digits>` folder, never
    makes `latest` return the run's own folder (or one outside it): it falls back to the highest
    complete step."""
    root = tmp_path / "run" / "checkpoints"
    _save(root, 2)
    _save(root, 4)
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


def test_resume_restores_the_global_rng_draws(tmp_path, monkeypatch):
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


# ---------------------------------------------------------------- what `load` refuses, and how it says so


def test_missing_files_are_listed_and_a_run_directory_gets_a_hint(tmp_path):
    """A folder missing checkpoint files names each missing one and the full set; only a folder with a
    `checkpoints/` inside (a run directory) gets the resume hint."""
    path = _save(tmp_path / "run" / "checkpoints", 2)
    for name in ("optimizer.pt", "rng.pt"):
        os.remove(os.path.join(path, name))
    holds = "an mmrl checkpoint folder holds policy.safetensors, optimizer.pt, scheduler.pt, rng.pt, state.json"
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as err:
        checkpoint.load(path, *_objects(0.0))
    assert str(err.value) == (f"config key 'resume': checkpoint {path!r} is missing optimizer.pt, rng.pt; {holds}")
    run = str(tmp_path / "run")
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as err:
        checkpoint.load(run, *_objects(0.0))
    assert str(err.value).endswith(f"{holds}; {run!r} looks like a run directory: pass output_dir={run} "
                                   f"resume=auto, or resume={run}/checkpoints/step_<n>")


@pytest.mark.parametrize("length", [400, 401])
def test_a_mismatch_message_keeps_400_characters_of_the_cause(tmp_path, monkeypatch, length):
    """The library's reason for a mismatch is quoted whole up to 400 characters, cut with '...' beyond."""
    path = _save(tmp_path, 2)
    cause = "x" * (length - 3) + "\n  yy"       # whitespace runs (a multi-line torch error) become one space

    def refuse(self, p):
        raise RuntimeError(cause)

    monkeypatch.setattr(BanditPolicy, "load", refuse)
    with pytest.raises(checkpoint.IncompatibleCheckpoint) as err:
        checkpoint.load(path, *_objects(0.0))
    flat = "x" * (length - 3) + " yy"                                           # `length` characters
    quoted = flat if length <= 400 else flat[:400] + "..."
    assert str(err.value) == (f"config key 'resume': checkpoint {path!r} does not match policy 'bandit' of "
                              f"this run: {quoted}. Resume it with the policy section it was trained with (its "
                              "run's config.yaml), or start a new run in another output_dir")


class _NotWeights:
    """An arbitrary pickled object: `torch.load(weights_only=True)` must refuse to run its code."""


def test_optimizer_and_scheduler_states_are_loaded_as_weights_only(tmp_path):
    """A checkpoint's optimizer.pt and scheduler.pt are read with weights_only=True: a file holding arbitrary
    pickled objects is refused instead of executed, with an error naming the file."""
    from mmrl.state.safe_load import UnsafeCheckpoint

    path = _save(tmp_path, 2)
    torch.save({"state": {}, "param_groups": [], "payload": _NotWeights()}, os.path.join(path, "optimizer.pt"))
    with pytest.raises(UnsafeCheckpoint, match=r"optimizer\.pt' is not a plain weights file: .*_NotWeights"):
        checkpoint.load(path, *_objects(0.0))
    path = _save(tmp_path / "again", 2)
    torch.save({"base_lrs": [0.1], "payload": _NotWeights()}, os.path.join(path, "scheduler.pt"))
    with pytest.raises(UnsafeCheckpoint, match=r"scheduler\.pt' is not a plain weights file: .*_NotWeights"):
        checkpoint.load(path, *_objects(0.0))


def test_a_weights_write_error_names_the_file_and_saving_a_step_again_leaves_nothing_aside(tmp_path, monkeypatch):
    """safetensors' own write error becomes a CheckpointError naming the weights file being written; saving
    an existing step again (after a resume) replaces it and leaves no `.old_` folder behind."""
    from safetensors import SafetensorError

    root = tmp_path / "checkpoints"
    _save(root, 2)

    def full(self, path):
        raise SafetensorError("No space left on device")

    with monkeypatch.context() as m:
        m.setattr(BanditPolicy, "save", full)
        with pytest.raises(CheckpointError) as err:
            _save(root, 4)
    tmp_weights = os.path.join(str(root), f".tmp_{STEP4}_{os.getpid()}", "policy.safetensors")
    assert f"cannot write {tmp_weights!r}: No space left on device" in str(err.value)
    _save(root, 2, value=7.0)
    assert sorted(os.listdir(root)) == ["latest", STEP2]
    _assert_loads(root / STEP2, 2, 7.0)


def test_keep_last_prunes_old_steps_and_killed_writes_of_other_processes(tmp_path, monkeypatch):
    """save keeps the newest `keep_last` steps (2 by default, at least 1) and removes `.tmp_` leftovers of
    other processes, never a temporary of its own process; a first write that fails says no earlier
    checkpoint exists."""
    root = tmp_path / "checkpoints"
    objs = _objects(1.0)
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
