"""What every torch model in mmrl needs to give the same bits on any process split: its weights at
aligned addresses, and forwards whose row count never depends on the batch's neighbours.

Why alignment. The CPU BLAS (MKL, which PyTorch's x86 builds use for fp32 matmuls) picks its kernel
path by the operands' addresses: `linear(x, W)` with W at an address that is not a multiple of 16
bytes rounds differently from the same W 64-byte aligned (measured here on AVX-512 and AVX2, torch
2.14). Weights loaded by transformers or diffusers from safetensors can sit at any 8-byte offset (views
into the file's bytes), and whether a load copies them depends on what else the process did: on one
machine a 2-process run got the text encoders 64-byte aligned and a 1-process run 8-byte aligned, and
their pooled text embeddings differed in the last bit. `align_weights` moves every misaligned parameter
and buffer into fresh memory from PyTorch's allocator (64-byte aligned on CPU), keeping shared
tensors shared, so a model computes the same bits in every process whatever its loading history.

Why fixed rows. A matmul's kernel is also chosen by the row count, so a row's output changes in its
last bits with how many rows share the forward. `fixed_rows` runs a function over a batch in chunks
of exactly `rows`, the last chunk padded with copies of its first row and the copies dropped.

This module lives at the bottom of the layering (rewards imports neither the core nor an adapter) so
that reward models use it too; the core re-exports it as `mmrl.distributed.determinism`.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")
ALIGNMENT = 64  # bytes: PyTorch's CPU allocator alignment (c10 gAlignment), a multiple of every SIMD width


def align_weights(module, alignment: int = ALIGNMENT):
    """Move every parameter and buffer of `module` whose data does not start at a multiple of `alignment`
    bytes into a fresh allocation, in place (the Parameter objects stay the same, so optimizers and tied
    weights keep them); tensors that viewed the same bytes view the same new copy. Returns `module`."""
    import torch

    moved: dict[tuple, torch.Tensor] = {}
    with torch.no_grad():
        for tensor in _tensors(module):
            if tensor.data_ptr() % alignment == 0:
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                   tuple(tensor.stride()), tensor.dtype)
            if key not in moved:
                moved[key] = tensor.detach().clone(memory_format=torch.contiguous_format)
            tensor.data = moved[key]
    return module


def _tensors(module) -> list:
    """Each parameter and buffer once (by identity), tied ones included once."""
    seen, out = set(), []
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def misaligned(module, alignment: int = ALIGNMENT) -> list[str]:
    """Names of the parameters and buffers of `module` not starting at a multiple of `alignment` bytes."""
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return [n for n, t in named if t.data_ptr() % alignment]


def fixed_rows(fn: Callable[[list[T]], Sequence], items: list[T], rows: int) -> list:
    """fn over `items` in calls of exactly `rows` items (the last call padded with copies of its first item,
    whose results are dropped) -> one result per item, in order; an item's result never depends on how
    many items the caller holds or which ones."""
    if rows < 1:
        raise ValueError(f"rows per call must be >= 1, got {rows}")
    out: list = []
    for lo in range(0, len(items), rows):
        part = list(items[lo:lo + rows])
        real = len(part)
        part += [part[0]] * (rows - real)
        results = list(fn(part))
        if len(results) != rows:
            raise ValueError(f"a batch function returned {len(results)} results for {rows} items")
        out += results[:real]
    return out
