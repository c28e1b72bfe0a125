"""Small collective helpers over `torch.distributed` (no-ops on one process)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce(values: list[float], op: str = "sum") -> list[float]:
    """Reduce a few floats across processes: op is sum, mean, min or max."""
    t = torch.tensor(values, dtype=torch.float64)
    if not _active():
        return t.tolist()
    ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=ops[op])
    t = t.cpu()
    if op == "mean":
        t /= dist.get_world_size()
    return t.tolist()
