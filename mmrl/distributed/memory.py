"""Memory metrics of a step, from the tensors themselves (this process's share under FSDP).

    mem/params_bytes     the trained model's parameters (frozen ones included) held by this process
    mem/grads_bytes      its gradients at the optimizer step (logged by the update)
    mem/optim_bytes      the optimizer's state tensors (AdamW: exp_avg, exp_avg_sq, step)
    mem/peak_rss_bytes   the process's peak resident memory (getrusage)
    mem/peak_cuda_bytes  torch.cuda.max_memory_allocated, on a CUDA device only
Each is the maximum over processes: what the fullest process holds.
"""

from __future__ import annotations

import resource
import sys

import torch

from mmrl.distributed.reduce import Metric, maximum
from mmrl.distributed.sharding import local


def tensor_bytes(tensors) -> int:
    """Bytes of `tensors` on this process (a DTensor counts its local shard)."""
    return sum(local(t).numel() * t.element_size() for t in tensors if t is not None)


def grads_bytes(params) -> int:
    return tensor_bytes(p.grad for p in params)


def optim_bytes(optimizer: torch.optim.Optimizer) -> int:
    return tensor_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)   # bytes on macOS, KiB on Linux


def metrics(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Metric]:
    row = {"mem/params_bytes": maximum(tensor_bytes(model.parameters())),
           "mem/optim_bytes": maximum(optim_bytes(getattr(optimizer, "optimizer", optimizer))),
           "mem/peak_rss_bytes": maximum(peak_rss_bytes())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        row["mem/peak_cuda_bytes"] = maximum(torch.cuda.max_memory_allocated())
    return row
