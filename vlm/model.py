"""Load a vision-language model and processor and set it up for RL training.

Anything `AutoModelForImageTextToText` / `AutoProcessor` load works (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, LLaVA, Idefics3/SmolVLM, Gemma 3), from a hub id, a local folder, or `tiny:<family>`
(`vlm.tiny`). Training is LoRA through peft (`policy.lora.rank > 0`) or full fine-tuning;
the vision tower and projector are frozen by default, and then LoRA never targets them.
"""

from __future__ import annotations

import re

import torch

from mmrl.distributed.determinism import align_weights
from vlm.features import VISION_MODULES, vision_modules
from vlm.tiny import resolve_model


def weight_dtype(name: str, precision: str, device, lora: bool) -> torch.dtype:
    """`policy.dtype`: auto = bf16 weights for a LoRA-frozen base under bf16 on GPU, else fp32.

    Full fine-tuning keeps fp32 master weights and relies on autocast (`precision`) for speed.
    """
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name in table:
        return table[name]
    if name != "auto":
        raise ValueError(f"config key 'policy.dtype' must be auto, fp32, bf16 or fp16; got {name!r}")
    on_gpu = torch.device(device).type == "cuda"
    return torch.bfloat16 if (lora and on_gpu and precision == "bf16") else torch.float32


def load_processor(cfg):
    from transformers import AutoProcessor

    path = resolve_model(cfg.processor or cfg.model)
    try:
        return AutoProcessor.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"config key 'policy.processor': cannot load a processor from {path!r}: {e}") from None


def load_model(cfg, device, dtype: torch.dtype):
    from transformers import AutoModelForImageTextToText
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the run's own progress display is the one a user reads
    path = resolve_model(cfg.model)
    kwargs = {"dtype": dtype}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    try:
        hf = AutoModelForImageTextToText.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as e:
        raise ValueError(f"config key 'policy.model': cannot load {path!r} as an image-text-to-text model: {e}") from None
    return align_weights(hf.to(device))  # the same bits whatever this process's loading history (mmrl.distributed.determinism)


def lora_targets(names: list[str], include_vision: bool) -> str:
    """A peft `target_modules` regex: the named linear layers, outside the vision side unless asked."""
    alt = "|".join(re.escape(n) for n in names)
    if include_vision:
        return rf".*\.({alt})$"
    skip = "|".join(VISION_MODULES)
    return rf"^(?!.*\.?({skip})\.).*\.({alt})$"


def setup_training(hf, cfg):
    """Freeze / LoRA-wrap `hf` in place; returns the PeftModel (or None for full fine-tuning)."""
    if cfg.freeze_vision:
        for module in vision_modules(hf).values():
            module.requires_grad_(False)
    peft_model = None
    if cfg.lora.rank > 0:
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                          target_modules=lora_targets(list(cfg.lora.target_modules), not cfg.freeze_vision),
                          bias="none")
        try:
            peft_model = get_peft_model(hf, lcfg)
        except ValueError as e:
            raise ValueError(f"config key 'policy.lora.target_modules': {e}") from None
    if cfg.gradient_checkpointing:
        if hasattr(hf, "activation_checkpointing_enable"):          # the name since transformers 5.2x
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return peft_model
