"""LoRA on the denoiser through peft (diffusers' `add_adapter`), saved in diffusers' LoRA format.

The file `save_lora` writes is what the pipeline's own `save_lora_weights` writes (keys prefixed by
`transformer.` / `unet.`, the peft LoraConfig in the `lora_adapter_metadata` header, so rank and
alpha survive), hence `pipe.load_lora_weights(folder, weight_name=...)` loads a checkpoint's
policy.safetensors as it is. `export_lora(folder)` writes the standard pytorch_lora_weights.safetensors.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List

import torch


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 32                  # r; 0 = full fine-tuning of the denoiser instead of LoRA
    alpha: float = 64.0             # lora_alpha (scale alpha / r); Flow-GRPO: r=32, alpha=64
    target_modules: List[str] = field(default_factory=list)  # empty = the family's defaults
    init: str = "gaussian"          # peft init_lora_weights: gaussian (Flow-GRPO) | default (kaiming A); B = 0


def add_lora(denoiser: torch.nn.Module, cfg: LoraConfig, targets: list[str]) -> None:
    """Inject a trainable LoRA adapter ("default") into the frozen `denoiser`; its weights are fp32."""
    from peft import LoraConfig as PeftLoraConfig

    if cfg.rank < 0 or cfg.alpha <= 0:
        raise ValueError(f"config keys 'policy.lora.rank' (>= 0) and 'policy.lora.alpha' (> 0) got "
                         f"{cfg.rank}, {cfg.alpha}")
    if cfg.init not in ("gaussian", "default"):
        raise ValueError(f"config key 'policy.lora.init' must be gaussian or default; got {cfg.init!r}")
    peft_cfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(targets),
                              init_lora_weights=True if cfg.init == "default" else "gaussian")
    try:
        denoiser.add_adapter(peft_cfg)
    except ValueError as e:  # peft: "Target modules ... not found in the base model"
        raise ValueError(f"config key 'policy.lora.target_modules' {list(targets)}: {e}") from None
    for name, p in denoiser.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # fp32 master weights (diffusers' cast_training_params)
            p.requires_grad_(True)


def lora_state_dict(denoiser: torch.nn.Module) -> dict:
    """The adapter's weights, keys without the adapter name (peft's get_peft_model_state_dict)."""
    from peft.utils import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(denoiser).items()}


def _metadata(denoiser) -> dict:
    meta = denoiser.peft_config["default"].to_dict()
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in meta.items()}


def save_lora(pipe_class, prefix: str, denoiser, path: str) -> None:
    """Write the adapter at `path` exactly as `pipe_class.save_lora_weights` does."""
    kwargs = {f"{prefix}_lora_layers": lora_state_dict(denoiser),
              f"{prefix}_lora_adapter_metadata": _metadata(denoiser)}
    pipe_class.save_lora_weights(os.path.dirname(path) or ".", weight_name=os.path.basename(path), **kwargs)


def export_lora(pipe_class, prefix: str, denoiser, folder: str) -> str:
    """A standard diffusers LoRA folder (pytorch_lora_weights.safetensors); returns the file's path."""
    path = os.path.join(folder, "pytorch_lora_weights.safetensors")
    os.makedirs(folder, exist_ok=True)
    save_lora(pipe_class, prefix, denoiser, path)
    return path


def load_lora(prefix: str, denoiser, path: str) -> None:
    """Load a file written by `save_lora` into the adapter (resume); errors name the mismatch."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    raw = load_file(path)
    state = {k[len(prefix) + 1:]: v for k, v in raw.items() if k.startswith(prefix + ".")}
    if not state:
        raise ValueError(f"{path} holds no '{prefix}.' LoRA weights (keys start {sorted(raw)[:3]})")
    result = set_peft_model_state_dict(denoiser, state, adapter_name="default")
    missing = [k for k in result.missing_keys if "lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"{path} does not match the policy's LoRA (policy.lora.*): unexpected "
                         f"{result.unexpected_keys[:3]}, missing {missing[:3]}")
