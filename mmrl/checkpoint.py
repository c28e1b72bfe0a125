"""Atomic checkpoints: written under a temporary name, fsynced, then renamed.

Layout of `output_dir/checkpoints/`:
    step_000010/   policy.safetensors, optimizer.pt, scheduler.pt, rng.pt, state.json
    latest         the name of the newest complete checkpoint (replaced atomically)
A directory named `step_*` is complete by construction, so a kill at any moment leaves
the previous `latest` usable.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import numpy as np
import torch

PREFIX = "step_"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    for dirpath, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(dirpath)


def write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(root: str, step: int, policy, optimizer, scheduler, trainer_state: dict, keep_last: int = 2) -> str:
    """Write checkpoint `step` under `root` atomically; returns its path."""
    os.makedirs(root, exist_ok=True)
    name = f"{PREFIX}{step:06d}"
    final, tmp = os.path.join(root, name), os.path.join(root, f".tmp_{name}_{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    policy.save(os.path.join(tmp, "policy.safetensors"))
    torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
    torch.save(scheduler.state_dict(), os.path.join(tmp, "scheduler.pt"))
    torch.save(rng_state(), os.path.join(tmp, "rng.pt"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"step": step, **trainer_state}, f, indent=1)
    _fsync_tree(tmp)
    if os.path.exists(final):  # re-saving a step after a resume: move the old one aside first
        old = final + f".old_{os.getpid()}"
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    write_text_atomic(os.path.join(root, "latest"), name + "\n")
    _prune(root, keep_last)
    return final


def complete(root: str) -> list[str]:
    """Complete checkpoint directories, oldest first."""
    if not os.path.isdir(root):
        return []
    names = [n for n in os.listdir(root) if n.startswith(PREFIX) and n[len(PREFIX):].isdigit()]
    return [os.path.join(root, n) for n in sorted(names)]


def _prune(root: str, keep_last: int) -> None:
    for path in complete(root)[:-max(keep_last, 1)]:
        shutil.rmtree(path, ignore_errors=True)
    for n in os.listdir(root):  # leftovers of killed writes
        if n.startswith(".tmp_") and not n.endswith(f"_{os.getpid()}"):
            shutil.rmtree(os.path.join(root, n), ignore_errors=True)


def latest(root: str) -> str | None:
    """The newest complete checkpoint: the `latest` pointer, else the highest step."""
    pointer = os.path.join(root, "latest")
    if os.path.isfile(pointer):
        with open(pointer) as f:
            path = os.path.join(root, f.read().strip())
        if os.path.isdir(path):
            return path
    found = complete(root)
    return found[-1] if found else None


def load(path: str, policy, optimizer, scheduler) -> dict:
    """Restore everything saved by `save`; returns the trainer state (with `step`)."""
    for name in ("policy.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "state.json"):
        if not os.path.isfile(os.path.join(path, name)):
            raise FileNotFoundError(f"checkpoint {path!r} is missing {name}; is it an mmrl checkpoint?")
    policy.load(os.path.join(path, "policy.safetensors"))
    optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), weights_only=True))
    scheduler.load_state_dict(torch.load(os.path.join(path, "scheduler.pt"), weights_only=True))
    set_rng_state(torch.load(os.path.join(path, "rng.pt"), weights_only=False))  # our own file
    with open(os.path.join(path, "state.json")) as f:
        return json.load(f)
