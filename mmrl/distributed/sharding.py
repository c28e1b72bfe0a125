"""FSDP2 sharding of a policy's model (`distributed.strategy: fsdp`).

PyTorch's `fully_shard` (torch.distributed.fsdp, "FSDP2") is applied here, by mmrl, on every launch
(torchrun or accelerate launch, one node or many; gloo on CPU, NCCL on GPU): one FSDP unit per
transformer / denoiser block, the classes each model names in `_no_split_modules` (transformers and
diffusers both declare them), then the root. Every parameter, gradient and AdamW state is then a
DTensor holding 1/N of its rows on each of the N ranks; a unit's weights are all-gathered just
before its forward and freed after it (`reshard_after_forward`), its gradients reduce-scattered
after its backward.

Collectives pair up across ranks only when every rank calls each unit the same number of times.
The trainer's microbatches have the same size on every rank; a policy whose forward runs a
data-dependent number of passes must make it uniform under sharding (the VLM scorer lays a
microbatch out once, `vlm.logprobs`). Rollouts are the other place where ranks diverge (a
generation stops when its own rows end; episodes take their own number of turns): with
`distributed.rollout: gathered` (the default) every unit is all-gathered once before the rollout and
generation runs with no collective at all; `sharded` leaves the blocks sharded and gathers each per
forward, which needs the ranks to step in lockstep (HF generate's `synced_gpus`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch

log = logging.getLogger("mmrl")


def _fsdp():
    from torch.distributed import fsdp

    return fsdp


def is_sharded(module) -> bool:
    return module is not None and isinstance(module, _fsdp().FSDPModule)


def block_classes(model: torch.nn.Module) -> set[str]:
    """The class names of the blocks that become one FSDP unit each: the union of the
    `_no_split_modules` that the model's (sub)modules declare (transformers' PreTrainedModel and
    diffusers' ModelMixin both carry it; a LoRA-wrapped model keeps its base's)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(type(m), "_no_split_modules", None) or [])
    return names


def blocks(model: torch.nn.Module, classes: set[str]) -> list[tuple[str, torch.nn.Module]]:
    """The outermost submodules of `model` whose class is in `classes`, in module order."""
    found: list[tuple[str, torch.nn.Module]] = []
    for name, m in model.named_modules():
        if name and type(m).__name__ in classes and not any(name.startswith(f + ".") for f, _ in found):
            found.append((name, m))
    return found


def mesh(device: torch.device):
    """A one-dimensional mesh over every process of the run (gloo on CPU, NCCL on GPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():  # a single process: FSDP2 still needs a process group of one
        dist.init_process_group("gloo" if torch.device(device).type == "cpu" else "nccl",
                                init_method="tcp://127.0.0.1:0", world_size=1, rank=0)
    return init_device_mesh(torch.device(device).type, (dist.get_world_size(),))


def mixed_precision(precision: str, device):
    """bf16 / fp16 parameters for compute with fp32 gradient reduction on GPU; fp32 everywhere on CPU."""
    fsdp = _fsdp()
    if torch.device(device).type != "cuda" or precision == "fp32":
        return fsdp.MixedPrecisionPolicy()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return fsdp.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard(model: torch.nn.Module, device, precision: str = "fp32", reshard_after_forward: bool = True,
          classes: set[str] | None = None) -> list[str]:
    """Apply `fully_shard` to each block of `model` and then to `model` itself (in place: `model`
    becomes an FSDPModule, its parameters DTensors); returns the names of the block units.

    The root's FSDP state is initialised here, so that any submodule may run first (generation
    calls the blocks without the root's forward)."""
    fsdp = _fsdp()
    dm, mp = mesh(device), mixed_precision(precision, device)
    found = blocks(model, block_classes(model) if classes is None else classes)
    for _, m in found:
        fsdp.fully_shard(m, mesh=dm, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fsdp.fully_shard(model, mesh=dm, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    model._get_fsdp_state()._lazy_init()  # private in torch 2.6-2.14: marks the root before any block runs
    if not found:
        log.warning("distributed.strategy=fsdp: %s declares no blocks (_no_split_modules); it is one FSDP unit",
                    type(model).__name__)
    return [name for name, _ in found]


def units(model) -> list:
    """The FSDP units of `model` (the root last); empty when it is not sharded."""
    return [m for m in model.modules() if is_sharded(m)][::-1] if model is not None else []


@contextlib.contextmanager
def gathered(*models, mode: str = "gathered", reshard_after_forward: bool = True) -> Iterator[None]:
    """Run the block with the weights of `models` (sharded or not) usable outside their forward.

    gathered: every unit all-gathered once, kept through the block, freed at its end: the block runs no
              collective (ranks may diverge: different generation lengths, episode turns);
    sharded:  only the root's own weights (embeddings, heads, outer layers) gathered; each block is
              gathered per forward, so every rank must run the same forwards (lockstep).
    Models that are not sharded pass through unchanged."""
    roots = [m for m in models if is_sharded(m)]
    picked = [u for r in roots for u in (units(r) if mode == "gathered" else [r])]
    if mode == "gathered":
        for r in roots:
            r.set_reshard_after_forward(False)
    for u in picked:
        u.unshard()
    try:
        yield
    finally:
        for u in picked:
            u.reshard()
        if mode == "gathered":
            for r in roots:
                r.set_reshard_after_forward(reshard_after_forward)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; any other tensor as it is."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (a collective: every rank calls it); any other tensor as it is."""
    full_tensor = getattr(t, "full_tensor", None)
    return full_tensor() if full_tensor is not None else t
