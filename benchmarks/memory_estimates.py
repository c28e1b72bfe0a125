"""Model-state memory per GPU for real models under DDP + LoRA and FSDP2 full fine-tuning (estimates, not measured).

Nothing is downloaded: parameter counts are the model cards' totals (approximate, 2-3 significant
digits), and the per-block and LoRA counts are computed from the configs' layer sizes given below.
Bytes per parameter, B = 2^30 bytes per GiB:

    DDP + LoRA (every GPU holds everything; N does not matter)
        bf16 frozen base:   2 * (P_trained + P_frozen)
        LoRA states:        16 * P_lora          fp32 weight 4 + fp32 grad 4 + AdamW m, v 4 + 4
    FSDP2 full fine-tuning over N GPUs
        sharded states:     16 * P_trained / N   fp32 master weight + fp32 grad + AdamW m, v, sharded 1/N
        bf16 working copy:  2 * (P_root + 2 * P_block)
                            FSDP2 (MixedPrecisionPolicy(param_dtype=bf16)) all-gathers one block at a time
                            and prefetches the next, so two of the largest blocks are unsharded at once; the
                            root unit (embeddings, lm_head, final layers: P_root = P_trained - sum of the
                            blocks) stays gathered for the whole forward and backward
        frozen, replicated: 2 * P_frozen         bf16 on every GPU

P_trained is the trained network (the VLM's language model; the denoiser transformer), P_frozen the
frozen parts (the VLM's vision tower, frozen by default: policy.freeze_vision; the text encoders and
VAE of a text-to-image pipeline), P_lora the LoRA parameters at rank 64 on mmrl's default targets:
r * (d_in + d_out) per targeted linear layer. Not included: activations, the transient bf16
gradients of the block being reduce-scattered, DDP gradient buckets, allocator fragmentation, a KL
reference copy for full fine-tuning (kl_beta > 0 adds 2 * P_trained / N under FSDP; with LoRA the
reference is the base with the adapter off, free), EMA weights, the KV cache, and the vLLM engine's
own memory (weights + KV cache: policy.vllm.gpu_memory_utilization of the GPU).

    python benchmarks/memory_estimates.py [--gpus 1 8 16]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

GIB = 2 ** 30
LORA_RANK = 64
LORA_STATE_BYTES = 16            # fp32 weight + fp32 grad + AdamW m and v
FULL_STATE_BYTES = 16            # fp32 master weight + fp32 grad + AdamW m and v
BF16 = 2


@dataclass(frozen=True)
class Model:
    """Parameter counts of one model (see the module docstring for the symbols)."""

    name: str
    trained: float                               # P_trained, model card (approximate)
    blocks: tuple[tuple[int, float], ...]        # (how many, params each) of its repeated blocks
    frozen: tuple[tuple[str, float], ...]        # (part, params) of its frozen parts
    lora: float                                  # P_lora at LORA_RANK

    @property
    def block(self) -> float:
        return max(p for _, p in self.blocks)

    @property
    def root(self) -> float:
        return self.trained - sum(n * p for n, p in self.blocks)

    @property
    def frozen_total(self) -> float:
        return sum(p for _, p in self.frozen)


# ---------------------------------------------------------------- counts from layer sizes

def qwen2_layer(h: int, inter: int, heads: int, kv_heads: int, head_dim: int = 128) -> float:
    """One Qwen2 decoder layer: q, k, v (with biases), o, the SwiGLU MLP and two RMSNorms."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return h * q + q + 2 * (h * kv + kv) + q * h + 3 * h * inter + 2 * h


def qwen2_lora(h: int, inter: int, heads: int, kv_heads: int, layers: int, r: int = LORA_RANK,
               head_dim: int = 128) -> float:
    """LoRA on q, k, v, o, gate, up, down of every layer (vlm/policy.py LoraSection.target_modules)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h)
    return r * per_layer * layers


def mmdit_block(h: int, dual: bool) -> float:
    """One SD3 joint block, two streams (image, context) of adaLN (6 h^2), q, k, v, out (4 h^2) and a
    4x MLP (8 h^2); MMDiT-X's dual-attention blocks add a second attention (4 h^2) and 3 more
    modulation outputs (3 h^2). Biases and norms are left out (< 0.1%)."""
    return 2 * 18 * h * h + (7 * h * h if dual else 0)


def flux_double_block(h: int) -> float:
    """FLUX double-stream block: per stream adaLN (6 h^2), q, k, v, out (4 h^2), 4x MLP (8 h^2)."""
    return 2 * 18 * h * h


def flux_single_block(h: int) -> float:
    """FLUX single-stream block: adaLN (3 h^2), linear1 h -> 3h + 4h (7 h^2), linear2 5h -> h (5 h^2)."""
    return 15 * h * h


# mmrl's default LoRA targets (diffusion/families/sd3.py, flux.py), r * (d_in + d_out) each, all h x h:
#   SD3:  to_q, to_k, to_v, to_out.0, add_q/k/v_proj, to_add_out: 8 layers of 2 h r per block
#         ("attn.to_q" does not match MMDiT-X's attn2.to_q, so the second attention is untouched)
#   FLUX: double blocks the same 8 (16 h r) plus ff and ff_context (h -> 4h -> h: 2 x 10 h r);
#         single blocks match attn.to_q/k/v only (6 h r)
def sd3_lora(h: int, layers: int, r: int = LORA_RANK) -> float:
    return layers * 8 * 2 * h * r


def flux_lora(h: int, double: int, single: int, r: int = LORA_RANK) -> float:
    return double * (16 + 20) * h * r + single * 6 * h * r


def wan_block(h: int, ffn: int) -> float:
    """One Wan 2.1 block: self-attention and cross-attention q, k, v, out (8 h^2; the text is projected to h
    once, at the root) and the MLP h -> ffn -> h; the adaLN table (6 h) and norms are left out."""
    return 8 * h * h + 2 * h * ffn


def wan_lora(h: int, ffn: int, layers: int, r: int = LORA_RANK) -> float:
    """mmrl's Wan targets (diffusion/families/wan.py): attn1 and attn2 q, k, v, out (8 x 2 h r) and both MLP
    layers (2 (h + ffn) r) of every block."""
    return layers * (16 * h + 2 * (h + ffn)) * r


# ---------------------------------------------------------------- the models

# Frozen text-to-image parts, parameter counts of the Hugging Face checkpoints (approximate): CLIP-L/14
# text encoder, OpenCLIP bigG/14 text encoder, T5 v1.1 XXL encoder, the 16-channel autoencoder
CLIP_L, CLIP_G, T5_XXL, VAE = 0.123e9, 0.695e9, 4.76e9, 0.084e9
# Wan 2.1's: the UMT5-XXL encoder (T5-XXL's with a 256k vocabulary: 4.76B + 0.92B more embeddings) and its
# causal 3D VAE (127M in the Wan report)
UMT5_XXL, WAN_VAE = 5.68e9, 0.127e9

MODELS = (
    # Qwen/Qwen2.5-VL-3B-Instruct: 3.75B in all, vision tower ~0.67B (32 ViT blocks, 1280 wide, + merger);
    # language model 36 layers, hidden 2048, MLP 11008, 16 heads, 2 KV heads, tied 151936 x 2048 embeddings
    Model("Qwen2.5-VL-3B", 3.75e9 - 0.67e9, ((36, qwen2_layer(2048, 11008, 16, 2)),),
          (("vision tower", 0.67e9),), qwen2_lora(2048, 11008, 16, 2, 36)),
    # Qwen/Qwen2.5-VL-7B-Instruct: 8.29B in all, vision tower ~0.68B; language model 28 layers, hidden 3584,
    # MLP 18944, 28 heads, 4 KV heads, untied 152064 x 3584 embeddings and lm_head
    Model("Qwen2.5-VL-7B", 8.29e9 - 0.68e9, ((28, qwen2_layer(3584, 18944, 28, 4)),),
          (("vision tower", 0.68e9),), qwen2_lora(3584, 18944, 28, 4, 28)),
    # stabilityai/stable-diffusion-3.5-medium: MMDiT-X transformer ~2.5B (model card), 24 blocks of width
    # 1536 (24 heads x 64), dual attention in blocks 0-12; CLIP-L + CLIP-G + T5-XXL encoders, 16-channel VAE
    Model("SD3.5-Medium", 2.5e9, ((13, mmdit_block(1536, True)), (11, mmdit_block(1536, False))),
          (("CLIP-L", CLIP_L), ("CLIP-G", CLIP_G), ("T5-XXL", T5_XXL), ("VAE", VAE)), sd3_lora(1536, 24)),
    # black-forest-labs/FLUX.1-dev: transformer ~11.9B (12B on the card), 19 double-stream + 38 single-stream
    # blocks of width 3072 (24 heads x 128); CLIP-L + T5-XXL encoders, VAE
    Model("FLUX.1-dev", 11.9e9, ((19, flux_double_block(3072)), (38, flux_single_block(3072))),
          (("CLIP-L", CLIP_L), ("T5-XXL", T5_XXL), ("VAE", VAE)), flux_lora(3072, 19, 38)),
    # Wan-AI/Wan2.1-T2V-1.3B-Diffusers: transformer 1.3B on the card, 1.42B counted (30 blocks of width 1536,
    # 12 heads x 128, MLP 8960, plus ~26M of patch, text and time embeddings and the output head);
    # UMT5-XXL encoder, Wan VAE. Activations (3510 tokens per forward for 33 frames at 240 x 416) excluded.
    Model("Wan2.1-T2V-1.3B", 1.42e9, ((30, wan_block(1536, 8960)),), (("UMT5-XXL", UMT5_XXL), ("VAE", WAN_VAE)),
          wan_lora(1536, 8960, 30)),
)


# ---------------------------------------------------------------- the arithmetic

def ddp_lora_bytes(m: Model) -> dict[str, float]:
    """DDP + LoRA, per GPU: bf16 base and frozen parts, fp32 LoRA weights, grads and AdamW states."""
    return {"trained states": LORA_STATE_BYTES * m.lora, "bf16 weights": BF16 * m.trained,
            "frozen bf16": BF16 * m.frozen_total}


def fsdp_full_bytes(m: Model, n: int) -> dict[str, float]:
    """FSDP2 full fine-tuning over n GPUs, per GPU: sharded fp32 states, the bf16 unsharded working
    set (root + two largest blocks), frozen parts in bf16 on every GPU."""
    return {"trained states": FULL_STATE_BYTES * m.trained / n, "bf16 weights": BF16 * (m.root + 2 * m.block),
            "frozen bf16": BF16 * m.frozen_total}


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:.1f}"


def rows(gpus: list[int]) -> list[list[str]]:
    """One row per model and setup: model, setup, the three parts and their total, GiB per GPU."""
    out = []
    for m in MODELS:
        setups = [(f"DDP + LoRA r{LORA_RANK} ({m.lora / 1e6:.0f}M trained), any N", ddp_lora_bytes(m))]
        setups += [(f"FSDP full fine-tuning, N={n}", fsdp_full_bytes(m, n)) for n in gpus]
        for label, parts in setups:
            out.append([m.name, label, *(gib(v) for v in parts.values()), gib(sum(parts.values()))])
    return out


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def headline(gpus: list[int]) -> str:
    """FLUX.1-dev's full fine-tuning per GPU at each N against its DDP + LoRA footprint."""
    flux = next(m for m in MODELS if m.name == "FLUX.1-dev")
    full = ", ".join(f"N={n} {sum(fsdp_full_bytes(flux, n).values()) / GIB:.1f}" for n in gpus)
    return (f"FLUX.1-dev model states per GPU (estimates, not measured): FSDP full fine-tuning {full} GiB; "
            f"DDP + LoRA r{LORA_RANK} {sum(ddp_lora_bytes(flux).values()) / GIB:.1f} GiB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 8, 16], help="FSDP world sizes N")
    args = ap.parse_args(argv)
    header = ["model", "setup", "trained states", "bf16 weights", "frozen bf16", "GiB per GPU"]
    print("Model-state memory per GPU, GiB (estimates, not measured; activations, KV cache and the vLLM "
          "engine excluded)\n")
    print(markdown_table(header, rows(args.gpus)))
    print("\ntrained states: fp32 LoRA weights, grads and AdamW (DDP), or 1/N of the fp32 weights, grads and "
          "AdamW (FSDP); bf16 weights: the whole base (DDP), or the root and the two largest blocks gathered "
          "(FSDP); frozen bf16: vision tower, or text encoders and VAE, on every GPU")
    print(f"headline: {headline(args.gpus)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
