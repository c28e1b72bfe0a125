"""Atomic checkpoints: written under a temporary name, fsynced, then renamed.

Layout of `output_dir/checkpoints/`:
    step_000010/   policy.safetensors, optimizer.pt, scheduler.pt, rng.pt, state.json
                   with an EMA (`train.ema_decay > 0`, `mmrl.loop.ema`) also:
                   policy_ema.safetensors  the averaged weights in the policy's own format (`policy.save`),
                                           what `policy.load` or diffusers' `load_lora_weights` take: the export
                   ema.safetensors         the fp32 average and its step count (what resume restores)
    latest         the name of the newest complete checkpoint (replaced atomically)
A sharded run (`distributed.strategy: fsdp`) writes `sharded/` (every process its own shards, in
`torch.distributed.checkpoint` form: weights, optimizer, EMA; `mmrl.state.dcp`) in place of
policy.safetensors, optimizer.pt and the EMA files; it loads into any number of processes.
A directory named `step_*` is complete by construction, so a kill at any moment leaves
the previous `latest` usable. What a killed write leaves behind (`.tmp_step_*_<pid>`,
`step_*.old_<pid>`, `<file>.tmp-<pid>`) is cleared by `clean_stale` when the next run starts.

Loading runs no code from the checkpoint (`mmrl.state.safe_load`): weights through safetensors, optimizer, scheduler
and RNG states (stored as tensors and plain containers) through torch's weights-only loader, a sharded folder's
metadata through an unpickler that admits only its own classes; anything else is refused naming the file.

Errors: a failed write (full disk, read-only folder) raises `CheckpointError` (the run stops);
a checkpoint that this run cannot load raises `IncompatibleCheckpoint`, a configuration error.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil

import numpy as np
import torch

from mmrl.errors import ConfigError
from mmrl.state.safe_load import UnsafeCheckpoint, load_pt

PREFIX = "step_"
FILES = ("policy.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "state.json")
SHARDED_FILES = ("sharded", "scheduler.pt", "rng.pt", "state.json")
EMA_FILES = ("policy_ema.safetensors", "ema.safetensors")


class CheckpointError(RuntimeError):
    """Writing a checkpoint failed (full disk, read-only folder); the CLI stops the run with exit code 1."""


class IncompatibleCheckpoint(ConfigError):
    """`resume` names a checkpoint this run cannot continue from (exit code 2)."""


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


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        try:
            os.remove(path)
        except OSError:
            pass


def write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def rng_state() -> dict:
    """The RNG states as tensors and plain containers (what torch's weights-only loader reads back)."""
    version, key, gauss = random.getstate()
    kind, mt, pos, has_gauss, cached = np.random.get_state()
    state = {"python": [version, list(key), gauss],
             "numpy": {"kind": kind, "key": torch.from_numpy(mt.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore `rng_state()`'s states (or the tuples and numpy state of checkpoints written before it)."""
    version, key, gauss = state["python"]
    random.setstate((version, tuple(key), gauss))
    npy = state["numpy"]
    if isinstance(npy, dict):
        npy = (npy["kind"], npy["key"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    np.random.set_state(npy)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _torch_save(obj, path: str) -> None:
    try:
        torch.save(obj, path)
    except RuntimeError as e:  # torch reports a failed write (a full disk, say) as a RuntimeError
        raise OSError(f"torch.save could not write {path!r}: {e}") from e


def _save_weights(save, path: str) -> None:
    from safetensors import SafetensorError

    try:
        save(path)
    except SafetensorError as e:  # how safetensors reports a failed write
        raise OSError(f"cannot write {path!r}: {e}") from e


MEMBERS = "policies"          # the folder of the policies trained beside the main one (multi-role runs, mmrl.roles)
MEMBER_FILES = ("policy.safetensors", "optimizer.pt", "scheduler.pt")


def member_dir(checkpoint_dir: str, name: str) -> str:
    """Where checkpoint `checkpoint_dir` keeps named policy `name` (its weights, optimizer and scheduler)."""
    return os.path.join(checkpoint_dir, MEMBERS, name)


def _write_members(tmp: str, members: dict) -> None:
    for name, (policy, optimizer, scheduler) in members.items():
        folder = member_dir(tmp, name)
        os.makedirs(folder)
        _save_weights(policy.save, os.path.join(folder, "policy.safetensors"))
        _torch_save(optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
        _torch_save(scheduler.state_dict(), os.path.join(folder, "scheduler.pt"))


def _write(tmp: str, step: int, policy, optimizer, scheduler, trainer_state: dict, ema, members: dict) -> None:
    os.makedirs(tmp)
    _write_members(tmp, members)
    _save_weights(policy.save, os.path.join(tmp, "policy.safetensors"))
    if ema is not None:
        with ema.swapped_in():
            _save_weights(policy.save, os.path.join(tmp, "policy_ema.safetensors"))
        _save_weights(ema.save, os.path.join(tmp, "ema.safetensors"))
    _torch_save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
    _torch_save(scheduler.state_dict(), os.path.join(tmp, "scheduler.pt"))
    _torch_save(rng_state(), os.path.join(tmp, "rng.pt"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"step": step, **trainer_state}, f, indent=1)
    _fsync_tree(tmp)


def _publish(tmp: str, final: str) -> None:
    """Rename the written `tmp` to `final`; a `final` already there (a step saved again after a
    resume) is moved aside first and put back if the rename fails."""
    if not os.path.exists(final):
        os.rename(tmp, final)
        return
    old = final + f".old_{os.getpid()}"
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except OSError:
        os.rename(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _write_trainer(tmp: str, step: int, scheduler, trainer_state: dict) -> None:
    """The files of the main process beside the sharded state; then the whole folder is fsynced."""
    _torch_save(scheduler.state_dict(), os.path.join(tmp, "scheduler.pt"))
    _torch_save(rng_state(), os.path.join(tmp, "rng.pt"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"step": step, **trainer_state}, f, indent=1)
    _fsync_tree(tmp)


def _main_pid() -> int:
    """The main process's pid on every process (it names the temporary folder they all write into)."""
    import torch.distributed as dist

    pid = [os.getpid()]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(pid, src=0)
    return pid[0]


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_sharded(root: str, step: int, policy, optimizer, scheduler, trainer_state: dict, keep_last: int = 2,
                 ema=None, main: bool = True) -> str | None:
    """`save` for a sharded run, called by every process: each writes its shards into one temporary
    folder, the main process adds its files and publishes it (same atomic guarantees as `save`)."""
    from mmrl.state import dcp

    name = f"{PREFIX}{step:06d}"
    final, tmp = os.path.join(root, name), os.path.join(root, f".tmp_{name}_{_main_pid()}")
    if main:
        os.makedirs(root, exist_ok=True)
        _remove(tmp)
        os.makedirs(tmp)
    _barrier()
    try:
        dcp.save(os.path.join(tmp, "sharded"), policy, optimizer, ema)   # collective
    except Exception as e:  # noqa: BLE001  (DCP gathers every process's OSError into its CheckpointException)
        if main:
            _remove(tmp)
        previous = latest(root)
        kept = (f"the checkpoint {previous!r} is intact and resume=auto continues from it" if previous
                else "no earlier checkpoint exists")
        raise CheckpointError(f"cannot write checkpoint {name} in {root!r}: {' '.join(str(e).split())[:300]}. "
                              f"The partial write was removed; {kept}. Free disk space or make the folder "
                              "writable, then run again") from None
    _barrier()
    if not main:
        return None
    return _finish(root, name, tmp, final, keep_last,
                   lambda: _write_trainer(tmp, step, scheduler, trainer_state))


def save(root: str, step: int, policy, optimizer, scheduler, trainer_state: dict, keep_last: int = 2,
         ema=None, members: dict | None = None) -> str:
    """Write checkpoint `step` under `root` atomically, with the averaged weights of `ema` (a
    `mmrl.loop.ema.EMA`) when given and the policies trained beside this one (`members`: name -> (policy,
    optimizer, scheduler), each in `policies/<name>/`); returns its path. An OS error (full disk, read-only
    folder) removes the partial write and raises `CheckpointError`; the previous checkpoint stays the `latest`."""
    name = f"{PREFIX}{step:06d}"
    final, tmp = os.path.join(root, name), os.path.join(root, f".tmp_{name}_{os.getpid()}")

    def write():
        os.makedirs(root, exist_ok=True)
        _remove(tmp)
        _write(tmp, step, policy, optimizer, scheduler, trainer_state, ema, members or {})

    return _finish(root, name, tmp, final, keep_last, write)


def _finish(root: str, name: str, tmp: str, final: str, keep_last: int, write) -> str:
    """Run `write` (which fills `tmp`), publish `tmp` as `final`, point `latest` at it, prune."""
    published = False
    try:
        write()
        _publish(tmp, final)
        published = True
        _fsync_dir(root)
        write_text_atomic(os.path.join(root, "latest"), name + "\n")
        _prune(root, keep_last)
    except OSError as e:
        _remove(tmp)
        previous = latest(root)
        done = (f"Checkpoint {name} itself is complete, but the 'latest' pointer still names the one before"
                if published else "The partial write was removed")
        kept = (f"the checkpoint {previous!r} is intact and resume=auto continues from it"
                if previous else "no earlier checkpoint exists")
        raise CheckpointError(f"cannot write checkpoint {name} in {root!r}: {e}. {done}; "
                              f"{kept}. Free disk space or make the folder writable, then run again") from None
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


# what interrupted writes leave: `<file>.tmp-<pid>`, `.tmp_step_<n>_<pid>/`, `step_<n>.old_<pid>/`
_STALE = re.compile(r"^(?:.+\.tmp-|\.tmp_step_\d+_|(?P<step>step_\d+)\.old_)(?P<pid>\d+)$")


def _writer_alive(pid: int) -> bool:
    """Whether process `pid`, another process than this one, may still be writing."""
    if pid == os.getpid() or pid <= 0:
        return False  # called at run start, before this process writes anything
    if os.name == "nt":
        return True  # no cheap liveness probe there: keep the file
    try:
        os.kill(pid, 0)  # pragma: no mutate (another signal would hit a live process: the test runner)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by another user
    except (OSError, OverflowError):
        return False
    return True


def clean_stale(folder: str) -> list[str]:
    """Remove the temporaries that killed writes left in `folder` (a run or checkpoint directory)
    and return their names. A `step_*.old_<pid>` folder whose step is missing (a kill between the
    two renames of `_publish`) is renamed back instead. Temporaries of a live process are kept."""
    if not os.path.isdir(folder):
        return []
    cleaned = []
    for name in sorted(os.listdir(folder)):
        m = _STALE.match(name)
        if not m or _writer_alive(int(m.group("pid"))):
            continue
        path, step = os.path.join(folder, name), m.group("step")
        try:
            if step and os.path.isdir(path) and not os.path.exists(os.path.join(folder, step)):
                os.rename(path, os.path.join(folder, step))
            else:
                _remove(path)
        except OSError:
            continue  # gone already, or not ours to remove: the next run tries again
        cleaned.append(name)
    return cleaned


def latest(root: str) -> str | None:
    """The newest complete checkpoint: the `latest` pointer, else the highest step. The pointer
    counts only when it names a `step_<digits>` directory directly under `root`."""
    pointer = os.path.join(root, "latest")
    if os.path.isfile(pointer):
        with open(pointer) as f:
            name = f.read().strip()
        path = os.path.join(root, name)
        if name.startswith(PREFIX) and name[len(PREFIX):].isdigit() and os.path.isdir(path):
            return path
    found = complete(root)
    return found[-1] if found else None


def _policy_name(policy) -> str:
    cfg = getattr(policy, "cfg", None)
    name, model = getattr(cfg, "name", type(policy).__name__), getattr(cfg, "model", "")
    return f"{name!r}" + (f" (model {model})" if model else "")


def is_sharded(path: str) -> bool:
    """Whether checkpoint `path` was written by a sharded run (`sharded/` in DCP form)."""
    return os.path.isdir(os.path.join(path, "sharded"))


def _check_files(path: str, ema) -> None:
    if is_sharded(path):
        missing = [n for n in SHARDED_FILES if not os.path.exists(os.path.join(path, n))]
        if missing:
            raise IncompatibleCheckpoint(f"config key 'resume': sharded checkpoint {path!r} is missing "
                                         f"{', '.join(missing)}; it holds {', '.join(SHARDED_FILES)}")
        return
    missing = [n for n in FILES if not os.path.isfile(os.path.join(path, n))]
    if not missing and ema is not None and not os.path.isfile(os.path.join(path, "ema.safetensors")):
        raise IncompatibleCheckpoint(f"config key 'train.ema_decay' is {ema.decay} but checkpoint {path!r} holds no "
                                     "ema.safetensors (its run kept no EMA); resume it with train.ema_decay=0, or "
                                     "start a new run in another output_dir")
    if not missing:
        return
    hint = (f"; {path!r} looks like a run directory: pass output_dir={path} resume=auto, or resume={path}/checkpoints/"
            "step_<n>" if os.path.isdir(os.path.join(path, "checkpoints")) else "")
    raise IncompatibleCheckpoint(f"config key 'resume': checkpoint {path!r} is missing {', '.join(missing)}; "
                                 f"an mmrl checkpoint folder holds {', '.join(FILES)}{hint}")


def _check_members(path: str, members: dict) -> None:
    for name in members:
        missing = [n for n in MEMBER_FILES if not os.path.isfile(os.path.join(member_dir(path, name), n))]
        if missing:
            raise IncompatibleCheckpoint(f"config key 'resume': checkpoint {path!r} holds no policy {name!r} (missing "
                                         f"{MEMBERS}/{name}/{', '.join(missing)}); resume it with the policies and "
                                         "roles it was trained with (its run's config.yaml)")


def load(path: str, policy, optimizer, scheduler, ema=None, members: dict | None = None) -> dict:
    """Restore everything saved by `save` (the average into `ema` when given; the policies trained beside this one
    into `members`, name -> (policy, optimizer, scheduler)); returns the trainer state (with `step`). A folder with
    missing files, or weights of another policy, raise `IncompatibleCheckpoint`."""
    from safetensors import SafetensorError

    from mmrl.distributed import sharding
    from mmrl.state import dcp

    members = members or {}
    _check_files(path, ema)
    _check_members(path, members)
    if sharding.is_sharded(policy.model) and not is_sharded(path):
        raise IncompatibleCheckpoint(
            f"config key 'resume': checkpoint {path!r} was written by an unsharded (ddp) run and this run is "
            "sharded (distributed.strategy=fsdp); resume it with distributed.strategy=ddp, or start from its "
            "exported weights (mmrl export)")
    try:
        if is_sharded(path):
            dcp.load(os.path.join(path, "sharded"), policy, optimizer, ema)
        else:
            policy.load(os.path.join(path, "policy.safetensors"))
            optimizer.load_state_dict(load_pt(os.path.join(path, "optimizer.pt")))
            if ema is not None:
                ema.load(os.path.join(path, "ema.safetensors"))
        for name, (member, member_opt, member_sched) in members.items():
            folder = member_dir(path, name)
            member.load(os.path.join(folder, "policy.safetensors"))
            member_opt.load_state_dict(load_pt(os.path.join(folder, "optimizer.pt")))
            member_sched.load_state_dict(load_pt(os.path.join(folder, "scheduler.pt")))
    except UnsafeCheckpoint:
        raise
    except (RuntimeError, ValueError, KeyError, SafetensorError) as e:
        detail = " ".join(str(e).split())
        raise IncompatibleCheckpoint(
            f"config key 'resume': checkpoint {path!r} does not match policy {_policy_name(policy)} of this run: "
            f"{detail[:400]}{'...' if len(detail) > 400 else ''}. Resume it with the policy section it was "
            "trained with (its run's config.yaml), or start a new run in another output_dir") from None
    scheduler.load_state_dict(load_pt(os.path.join(path, "scheduler.pt")))
    set_rng_state(load_pt(os.path.join(path, "rng.pt"), legacy_numpy=True))
    with open(os.path.join(path, "state.json")) as f:
        return json.load(f)
