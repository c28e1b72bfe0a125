"""Model families: one class per diffusers pipeline, each with the same small surface.

    load(model, opts) -> pipeline        from_pretrained(hub id or local folder)
    Family(pipe, opts)                   .denoiser (the trainable module), .uncond, .uses_cfg, .lora_prefix
    encode(prompts) -> [Cond]            frozen text encoders, once per prompt
    schedule(S, rule) -> Schedule        plain tensors indexed by integer step
    noise(n, generator) -> [n, ...]      initial latents
    model_rows / forward                 the denoiser call that `common.predict` chunks and guides
    decode(latents) -> [PIL.Image]       VAE decoding as the pipeline does it ([rewards.Video] for video
                                         families, `video = True`: wan)

The state, `noise` and `decode` the families share live in `common.PipelineFamily`. The family of
a checkpoint is read from its model_index.json (`_class_name`); `policy.family` names one directly.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

from mmrl.distributed.determinism import align_weights
from mmrl.registry import Registry

# policy.family -> the family class, imported on first use (each module imports only its diffusers pipeline)
FAMILIES: Registry = Registry("model family")
FAMILIES.update({"sd3": "diffusion.families.sd3:SD3Family", "sd": "diffusion.families.sd:SDFamily",
                 "flux": "diffusion.families.flux:FluxFamily", "wan": "diffusion.families.wan:WanFamily"})
PIPELINES = {"StableDiffusion3Pipeline": "sd3", "StableDiffusionPipeline": "sd", "FluxPipeline": "flux",
             "WanPipeline": "wan"}
VIDEO_FAMILIES = ("wan",)


@dataclass(frozen=True)
class FamilyOptions:
    device: Any
    dtype: Any                      # torch dtype of the frozen weights (text encoders, VAE, base denoiser)
    height: int = 0                 # 0 = the model's default
    width: int = 0
    negative_prompt: str = ""
    max_sequence_length: int = 256  # T5 tokens (sd3, flux, wan)
    num_frames: int = 0             # video families: frames per clip, 0 = the model's default
    fps: float = 16.0               # video families: frame rate of the decoded clips
    prediction_type: Optional[str] = None
    revision: Optional[str] = None
    variant: Optional[str] = None


def detect(model: str, revision: str | None = None) -> str:
    """The family of a pipeline folder or hub id, from model_index.json's `_class_name`."""
    index = os.path.join(model, "model_index.json")
    if os.path.isdir(model):
        if not os.path.isfile(index):
            raise ValueError(f"config key 'policy.model': {model!r} has no model_index.json (not a diffusers pipeline)")
        with open(index) as f:
            name = json.load(f).get("_class_name", "")
    elif model.startswith(("/", "./", "../", "~")):
        raise ValueError(f"config key 'policy.model': folder {model!r} does not exist")
    else:  # a hub id: diffusers fetches model_index.json
        from diffusers import DiffusionPipeline

        try:
            name = DiffusionPipeline.load_config(model, revision=revision).get("_class_name", "")
        except OSError as e:
            raise ValueError(f"config key 'policy.model': cannot load {model!r} from the hub or cache: "
                             f"{str(e).splitlines()[0]}") from None
    if name not in PIPELINES:
        raise ValueError(f"config key 'policy.model': pipeline {name!r} of {model!r} is not supported; "
                         f"supported: {', '.join(PIPELINES)} (or set policy.family to one of {FAMILIES.valid()})")
    return PIPELINES[name]


TINY_DDIM_MODELS = ("tiny:sd", "tiny:sd_v")    # diffusion/tiny.py's DDIM builds


def declared_ddim(family: str, model: str) -> bool:
    """Whether a `policy:` section already says, before any model is loaded, that it samples with DDIM (the
    `sd` family, or a tiny SD model); a hub or folder model under `family: auto` is known only once detected."""
    return family == "sd" or (family == "auto" and model in TINY_DDIM_MODELS)


def family_class(name: str):
    """The family class of a `policy.family` value other than auto."""
    if name not in FAMILIES:
        raise ValueError(f"config key 'policy.family' must be auto or one of {FAMILIES.valid()}; got {name!r}")
    return FAMILIES.resolve(name, "policy.family")


def lora_targets(name: str) -> list[str]:
    """The family's default LoRA target modules (the LORA_TARGETS of its module)."""
    import sys

    return list(sys.modules[family_class(name).__module__].LORA_TARGETS)


def load(name: str, model: str, opts: FamilyOptions):
    """Load the pipeline of family `name` from `model` and wrap it (text encoders and VAE frozen)."""
    import warnings

    from transformers.utils import logging as tlog

    cls = family_class(name)
    tlog.disable_progress_bar()
    with warnings.catch_warnings():  # newer diffusers rename torch_dtype to dtype; older ones need torch_dtype
        warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
        try:
            pipe = cls.load(model, opts).to(opts.device)
        except OSError as e:  # missing files, no connection to the hub
            raise ValueError(f"config key 'policy.model': cannot load {model!r}: {str(e).splitlines()[0]}") from None
    pipe.set_progress_bar_config(disable=True)
    for part in ("text_encoder", "text_encoder_2", "text_encoder_3", "vae", "transformer", "unet"):
        module = getattr(pipe, part, None)
        if module is not None:
            module.requires_grad_(False)
            module.eval()
            align_weights(module)  # the same bits whatever this process's loading history (mmrl.distributed.determinism)
    return cls(pipe, opts)
