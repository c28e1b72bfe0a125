"""Results that do not depend on the process split, the batch's neighbours or the CPU.

The guarantee (CPU, fp32): a sample's outputs, log-probs and rewards depend only on its seed, its
prompt and the weights, never on how many processes share the step, which other samples a forward
holds, or where the weights happen to sit in memory. Three rules give it:

1. Every forward whose rows come from a process's share of the step runs at a fixed row count (the
   denoiser and VAE in `forward_batch` / `decode_batch` chunks, the LM head in `logprob_chunk`
   positions, text encoders at batch 1, image rewards in `batch_size` chunks), padded with copies.
2. Every loaded model's weights start at 64-byte aligned addresses (`align_weights`): MKL's fp32
   matmul rounds differently for an operand at an 8-byte offset.
3. Randomness comes from per-prompt generators seeded from (run seed, step, position in the global
   batch), never from the rank.

Which CPU kernels run is chosen at start-up from the instruction set (PyTorch's ATen dispatch:
DEFAULT, AVX2, AVX512; oneDNN; MKL), and the rules must hold under each, because a kernel for one
instruction set may treat a row by its position or neighbours where another does not. `ISA_LIMITS`
names the settings that restrict the kernels to a lower instruction set, which is how the suite runs
its split-independence tests a second time (tests/core/test_rank_independence.py, test_fsdp.py).
Results are the same across process splits on one machine, under either setting; they are not the
same between two instruction sets (a sum rounds differently with a different vector width), so a
run resumed on a machine of another CPU kind continues correctly but not bit for bit.

HF generation (vlm/generation.py) keeps rule 1 by running one prompt's G rows per call by default (an
episode's: one group's live trajectories); `policy.generate_rows_per_call` above G left-pads several
prompts into one call, trading this exactness for throughput (a sampled token can change where two
scores tie to the last bit). The local VLM judge (rewards/judge_backends.py) pads a batch to its longest
conversation; with `batch_size: 1` its replies do not depend on the batch.

On GPU the same rules give split independence where the kernels are deterministic for a fixed
shape: set `torch.use_deterministic_algorithms(True)` and CUBLAS_WORKSPACE_CONFIG=:4096:8, and
keep the chunk sizes fixed. Atomics-based kernels (some attention backward passes, scatter-add)
are not deterministic even at fixed shapes; bf16 autocast changes the bits but not the rules.
Untested here (no GPU on the CI machines).
"""

from __future__ import annotations

import os

from rewards.models import ALIGNMENT, align_weights, fixed_rows, misaligned

__all__ = ["ALIGNMENT", "ISA_LIMITS", "align_weights", "fixed_rows", "isa_env", "lower_isa", "misaligned"]

# Environment settings that restrict the CPU kernels to an instruction set, read at process start.
# ATEN_CPU_CAPABILITY picks PyTorch's own vectorised kernels (elementwise ops, reductions, softmax, norms);
# ONEDNN_MAX_CPU_ISA oneDNN's (convolutions, some matmuls); MKL_ENABLE_INSTRUCTIONS MKL's BLAS.
ISA_LIMITS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}


def lower_isa() -> str:
    """The ISA_LIMITS entry below the kernels this machine runs by default: `avx2` where PyTorch picks its
    AVX-512 kernels, else `default` (the plain vectorised builds; on an AVX2 machine that is the only lower
    set, on another architecture it restricts PyTorch's own kernels only)."""
    import torch

    return "avx2" if torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512") else "default"


def isa_env(isa: str, base: dict | None = None) -> dict:
    """`base` (default: this process's environment) with the CPU kernels limited to `isa` (a key of ISA_LIMITS)."""
    if isa not in ISA_LIMITS:
        raise ValueError(f"instruction set must be one of {', '.join(ISA_LIMITS)}; got {isa!r}")
    return {**(os.environ if base is None else base), **ISA_LIMITS[isa]}
