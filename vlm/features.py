"""Image features: encode each prompt's images once, then reuse them for every sample and update.

transformers 5.x multimodal models accept precomputed encoder outputs through
`forward(..., mm_encoder_outputs={"image": out})` and `generate` passes them through unchanged,
where `out = model.get_image_features(**encoder_inputs, return_dict=True)`. With the vision
side frozen (`policy.freeze_vision`, the default) the rollout encodes each prompt's images
once (no grad) and the G samples of its group, generation, old log-probs and every update
epoch reuse those features; with it trainable, the scoring forward re-encodes with grad.

`pooler_output` is a sequence of [tokens, hidden] tensors whose order follows the prompts
(per image for Qwen-VL and LLaVA, per prompt for Idefics3) or one [n, tokens, hidden] tensor
(Gemma 3); Qwen3-VL adds `deepstack_features`, one [tokens, hidden] tensor per deepstack layer.
`Encoded` keeps one prompt's part; `merge` rebuilds the model's output type for a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Submodules of the base model that `get_image_features` runs (vision towers and projectors).
VISION_MODULES = ("visual", "vision_tower", "vision_model", "multi_modal_projector", "connector", "mm_projector")


def base_model(hf):
    """The model under the LM head (`Qwen2_5_VLModel`, `LlavaModel`, ...)."""
    return getattr(hf, hf.base_model_prefix)


def vision_modules(hf) -> dict[str, torch.nn.Module]:
    base = base_model(hf)
    found = {n: getattr(base, n) for n in VISION_MODULES if isinstance(getattr(base, n, None), torch.nn.Module)}
    if not found:
        raise ValueError(f"{type(hf).__name__}: found none of the vision submodules {VISION_MODULES} "
                         "(set policy.freeze_vision=false for this architecture)")
    return found


@dataclass(frozen=True)
class Encoded:
    """One prompt's image features: `pooled` [tokens, hidden] tensors in prompt order.

    stacked:   the model wants `pooler_output` as one [n, tokens, hidden] tensor (Gemma 3) instead of
               a sequence (Qwen-VL, LLaVA, Idefics3).
    deepstack: Qwen3-VL's per-layer [tokens, hidden] features, or None.
    """

    output_cls: type
    pooled: tuple
    stacked: bool = False
    deepstack: list | None = None


def encode(hf, encoder_inputs: dict, device) -> Encoded | None:
    """The encoder output for one prompt's images (None for a text-only prompt)."""
    if not encoder_inputs:
        return None
    inputs = {k: v.to(device) for k, v in encoder_inputs.items()}
    out = base_model(hf).get_image_features(**inputs, return_dict=True)
    return slim(out)


def slim(out) -> Encoded:
    """Keep only what the language model consumes (drops the tower's hidden states)."""
    pooled, stacked = out.pooler_output, isinstance(out.pooler_output, torch.Tensor)
    if stacked:
        pooled = tuple(pooled.unbind(0)) if pooled.dim() == 3 else (pooled,)
    deep = getattr(out, "deepstack_features", None)
    return Encoded(type(out), tuple(pooled), stacked and out.pooler_output.dim() == 3,
                   list(deep) if deep is not None else None)


def merge(outputs: list) -> dict | None:
    """`mm_encoder_outputs` for a batch whose rows use `outputs` in order (None entries = no image)."""
    outs = [o for o in outputs if o is not None]
    if not outs:
        return None
    pooled = tuple(t for o in outs for t in o.pooled)
    merged = {"pooler_output": torch.stack(pooled) if outs[0].stacked else pooled}
    if outs[0].deepstack is not None:
        layers = len(outs[0].deepstack)
        merged["deepstack_features"] = [torch.cat([o.deepstack[k] for o in outs]) for k in range(layers)]
    return {"image": outs[0].output_cls(**merged)}


def concat(outputs: list) -> Encoded | None:
    """One `Encoded` for the images of several segments of one sequence, in order (None entries: no image);
    a multi-turn trajectory's observations, each encoded once when it arrived."""
    outs = [o for o in outputs if o is not None]
    if not outs:
        return None
    deep = None
    if outs[0].deepstack is not None:
        deep = [torch.cat([o.deepstack[k] for o in outs]) for k in range(len(outs[0].deepstack))]
    return Encoded(outs[0].output_cls, tuple(t for o in outs for t in o.pooled), outs[0].stacked, deep)
