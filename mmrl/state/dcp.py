"""Checkpoint state in `torch.distributed.checkpoint` (DCP) form: the checkpoints of sharded runs.

Under `distributed.strategy: fsdp` every process writes its own shards of one state into the
folder `sharded/` of a checkpoint (and the main process the `.metadata` index):

    model       the trained parameters (frozen ones are rebuilt from the pretrained weights), by name
    optim       the optimizer state, keyed by parameter name (torch.distributed.checkpoint.state_dict)
    ema         the EMA's fp32 average (`mmrl.loop.ema`) and its step count, when the run keeps one
    policy      what the policy keeps besides its parameters (`Policy.extra_state`: DiffusionNFT's
                sampling copy), when it has anything

DCP reshards on load, so the folder loads into any number of processes: the same world size
(bit-exact resume), another one, or a single process with an unsharded model (`mmrl export`,
or a `ddp` run).
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from mmrl.state.safe_load import safe_reader
from mmrl.types import HasExtraState


@contextlib.contextmanager
def _quiet():
    """DCP warns when it runs without a process group (`mmrl export`, a 1-process run): that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _options(**kwargs):
    """Trainable parameters only (frozen ones come from the pretrained weights); not strict on load, since
    the frozen ones are absent by design (DCP's own load checks that every trainable one is there)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, **kwargs)


def bare(module: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP wrapper; an FSDP module (sharded in place) or a plain one as it is."""
    return getattr(module, "module", module)


def bare_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)   # accelerate's AcceleratedOptimizer wraps the torch one


def state(policy, optimizer=None, ema=None) -> dict:
    """The checkpoint state of a run, its tensors those of the live objects (sharded or not): the
    template DCP loads into in place."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
    )

    model = bare(policy.model)
    if optimizer is None:
        out = {"model": get_model_state_dict(model, options=_options())}
    else:
        model_sd, optim_sd = get_state_dict(model, bare_optimizer(optimizer), options=_options())
        out = {"model": model_sd, "optim": optim_sd}
    if ema is not None:
        out["ema"] = {**{f"param_{i:05d}": bar for i, bar in enumerate(ema.shadow)},
                      "steps": torch.tensor(ema.steps)}
    if isinstance(policy, HasExtraState) and policy.extra_state():
        out["policy"] = policy.extra_state()
    return out


def save(folder: str, policy, optimizer, ema=None) -> None:
    """Write this process's shards of the run's state into `folder` (every process calls it)."""
    import torch.distributed.checkpoint as dcp

    with _quiet():
        dcp.save(state(policy, optimizer, ema), checkpoint_id=folder)


def load(folder: str, policy, optimizer=None, ema=None) -> None:
    """Load `folder` (written by any number of processes) into the live policy, optimizer and EMA of
    this run, resharded to its processes; ValueError / RuntimeError when it does not fit."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_state_dict,
    )

    template = state(policy, optimizer, ema)
    with _quiet():
        dcp.load(template, storage_reader=safe_reader(folder))
    model = bare(policy.model)
    if optimizer is None:
        set_model_state_dict(model, template["model"], options=_options(strict=False))
    else:
        set_state_dict(model, bare_optimizer(optimizer), model_state_dict=template["model"],
                       optim_state_dict=template["optim"], options=_options(strict=False))
    if ema is not None:
        ema.steps = int(template["ema"]["steps"])          # the average itself was loaded in place
    if "policy" in template:
        policy.load_extra_state(template["policy"])


def has_ema(folder: str) -> bool:
    """Whether the sharded state in `folder` holds an EMA's average."""
    return any(k.startswith("ema.") for k in safe_reader(folder).read_metadata().state_dict_metadata)


def load_weights(folder: str, policy, ema: bool = False) -> None:
    """Only the trained weights of `folder` into `policy` (one process, no optimizer): the EMA's average
    instead when `ema` (what `mmrl export --ema` writes)."""
    import torch.distributed.checkpoint as dcp

    if not ema:
        load(folder, policy)
        return
    params = list(policy.trainable_parameters())
    average = {f"param_{i:05d}": p.detach().float().clone() for i, p in enumerate(params)}
    with _quiet():
        dcp.load({"ema": average}, storage_reader=safe_reader(folder))
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(average[f"param_{i:05d}"])
