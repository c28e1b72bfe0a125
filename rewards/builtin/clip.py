"""Model-based image rewards: CLIP score, PickScore, HPSv2, LAION aesthetic.

Each is a factory (`factory=True`): called once with the config kwargs, it builds the model (eval
mode, on `device`, in `dtype`) and returns `reward(samples) -> list[float | None]`, which scores
`sample.output` (a PIL image) against `sample.prompt` under no grad, `batch_size` images at a
time. Non-image outputs score None. Heavy imports (torch, open_clip, transformers) happen inside.
"""

from __future__ import annotations

import json
import os
import tempfile

from rewards.models import align_weights, fixed_rows
from rewards.registry import register

_DTYPES = ("float32", "float16", "bfloat16")
_CONFIG_DIR: str | None = None  # where custom open_clip configs are written (once per process)


def check_open_clip_args(dtype: str, model_config: dict | None) -> None:
    """The open_clip arguments checked before any model is built: `dtype` and a custom `model_config`."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if model_config is not None and not (isinstance(model_config, dict) and
                                         all(k in model_config for k in ("embed_dim", "vision_cfg", "text_cfg"))):
        raise ValueError("model_config must be an open_clip model config dict with keys "
                         f"embed_dim, vision_cfg, text_cfg; got {model_config!r}")


def _torch_dtype(dtype: str):
    import torch

    check_open_clip_args(dtype, None)
    return getattr(torch, dtype)


def _add_open_clip_config(name: str, config: dict) -> None:
    """Register `config` as open_clip model `name` (open_clip reads configs from JSON files)."""
    import open_clip

    global _CONFIG_DIR
    check_open_clip_args(_DTYPES[0], config)
    _CONFIG_DIR = _CONFIG_DIR or tempfile.mkdtemp(prefix="mmrl_open_clip_configs_")
    path = os.path.join(_CONFIG_DIR, f"{name}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    open_clip.add_model_config(path)


def _open_clip(model: str, pretrained: str | None, model_config: dict | None, device: str, dtype: str):
    """(model, preprocess, tokenizer) from open_clip; `pretrained=None` means random init."""
    import open_clip

    torch_dtype = _torch_dtype(dtype)
    if model_config is not None:
        _add_open_clip_config(model, model_config)
    elif ":" not in model and model not in open_clip.list_models():
        raise ValueError(f"unknown open_clip model {model!r}: see open_clip.list_models(), "
                         "use 'hf-hub:org/repo', or pass model_config")
    try:
        net, _, preprocess = open_clip.create_model_and_transforms(model, pretrained=pretrained)
    except RuntimeError as e:
        raise ValueError(f"cannot build open_clip model {model!r} with pretrained={pretrained!r}: {e}") from e
    net = align_weights(net.to(device=device, dtype=torch_dtype).eval().requires_grad_(False))
    return net, preprocess, open_clip.get_tokenizer(model)


def _image_reward(name: str, score_batch, batch_size: int):
    """Wrap `score_batch(samples_with_images) -> list[float]` into a reward over any samples."""
    from PIL import Image

    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"{name}: batch_size must be a positive integer, got {batch_size!r}")

    def reward(samples: list) -> list[float | None]:
        scores: list[float | None] = [None] * len(samples)
        idx = [i for i, s in enumerate(samples) if isinstance(s.output, Image.Image)]
        # calls of exactly batch_size images: a score never depends on the other samples this process holds
        for i, v in zip(idx, fixed_rows(score_batch, [samples[i] for i in idx], batch_size)):
            scores[i] = float(v)
        return scores

    reward.__name__ = reward.__qualname__ = name
    return reward


def _clip_embeds(net, preprocess, tokenizer, batch, device, with_text=True):
    """L2-normalised image embeddings [B, D] (and text embeddings [B, D]) of a batch of samples."""
    import torch
    import torch.nn.functional as F

    dtype = next(net.parameters()).dtype
    pixels = torch.stack([preprocess(s.output.convert("RGB")) for s in batch]).to(device, dtype)  # [B, 3, H, W]
    img = F.normalize(net.encode_image(pixels).float(), dim=-1)                                  # [B, D]
    if not with_text:
        return img, None
    tokens = tokenizer([s.prompt for s in batch]).to(device)                                     # [B, ctx]
    return img, F.normalize(net.encode_text(tokens).float(), dim=-1)                             # [B, D]


@register("clip_score", factory=True)
def clip_score(model: str = "ViT-H-14", pretrained: str | None = "laion2b_s32b_b79k", scale: float = 1.0,
               model_config: dict | None = None, device: str = "cpu", dtype: str = "float32",
               batch_size: int = 32):
    """scale * cos(image, prompt) with open_clip; raw cosine in [-1, 1].

    CLIPScore (Hessel et al., arXiv 2104.08718) reports 2.5 * max(cos, 0); here the cosine is
    not clipped, so `scale=2.5` gives that score on the positive side. `pretrained=None` is a
    random init; `model_config` registers a custom open_clip architecture under `model`.
    """
    import torch

    net, preprocess, tokenizer = _open_clip(model, pretrained, model_config, device, dtype)

    @torch.no_grad()
    def score(batch):
        img, txt = _clip_embeds(net, preprocess, tokenizer, batch, device)
        return (scale * (img * txt).sum(-1)).tolist()  # [B]

    return _image_reward("clip_score", score, batch_size)


@register("pickscore", factory=True)
def pickscore(model: str = "yuvalkirstain/PickScore_v1", processor: str = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
              scale_div: float = 26.0, device: str = "cpu", dtype: str = "float32", batch_size: int = 32):
    """PickScore (arXiv 2305.01569): logit_scale.exp() * cos(image, prompt) / scale_div.

    `model` and `processor` are Hugging Face hub ids or local folders (a transformers CLIPModel
    and its CLIPProcessor). Flow-GRPO divides by 26, which puts typical scores near 0.8-0.9.
    """
    import torch
    from transformers import AutoModel, AutoProcessor

    if not scale_div or scale_div <= 0:
        raise ValueError(f"pickscore: scale_div must be > 0, got {scale_div!r}")
    torch_dtype = _torch_dtype(dtype)
    proc = AutoProcessor.from_pretrained(processor)
    net = align_weights(AutoModel.from_pretrained(model).to(device=device, dtype=torch_dtype).eval().requires_grad_(False))
    max_len = min(77, net.config.text_config.max_position_embeddings)

    @torch.no_grad()
    def score(batch):
        pix = proc(images=[s.output.convert("RGB") for s in batch], return_tensors="pt")["pixel_values"]
        txt = proc(text=[s.prompt for s in batch], padding="max_length", truncation=True, max_length=max_len,
                   return_tensors="pt")
        out = net(pixel_values=pix.to(device, torch_dtype), input_ids=txt["input_ids"].to(device),
                  attention_mask=txt["attention_mask"].to(device))
        img = out.image_embeds.float() / out.image_embeds.float().norm(dim=-1, keepdim=True)  # [B, D]
        tx = out.text_embeds.float() / out.text_embeds.float().norm(dim=-1, keepdim=True)     # [B, D]
        return (net.logit_scale.float().exp() * (img * tx).sum(-1) / scale_div).tolist()     # [B]

    return _image_reward("pickscore", score, batch_size)


def _load_state_dict(path: str) -> dict:
    """A state dict from .safetensors or a torch file (weights_only); unwraps `state_dict`, `module.`."""
    import torch

    if not os.path.isfile(path):
        raise ValueError(f"checkpoint file {path!r} does not exist")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(path)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    return {k.removeprefix("module."): v for k, v in state.items()}


@register("hpsv2", factory=True)
def hpsv2(checkpoint: str | None = None, model: str = "ViT-H-14", pretrained: str | None = None,
          model_config: dict | None = None, device: str = "cpu", dtype: str = "float32", batch_size: int = 32):
    """HPS v2 / v2.1 (arXiv 2306.09341): cos(image, prompt) of the fine-tuned open_clip ViT-H-14, in [-1, 1].

    HPSv2's own code scores with this cosine (no logit scale); its paper reports it x100.
    `checkpoint` is HPS_v2_compressed.pt or HPS_v2.1_compressed.pt (a `state_dict` key, or a plain
    state dict); it replaces every weight, so `pretrained` defaults to None (no download).
    """
    import torch

    if checkpoint is None:
        raise ValueError("hpsv2 needs checkpoint=PATH: download HPS_v2.1_compressed.pt (or HPS_v2_compressed.pt) "
                         "from the Hugging Face repo xswu/HPSv2 (github.com/tgxs002/HPSv2)")
    net, preprocess, tokenizer = _open_clip(model, pretrained, model_config, device, dtype)
    net.load_state_dict(_load_state_dict(checkpoint))

    @torch.no_grad()
    def score(batch):
        img, txt = _clip_embeds(net, preprocess, tokenizer, batch, device)
        return (img * txt).sum(-1).tolist()  # [B]

    return _image_reward("hpsv2", score, batch_size)


def aesthetic_mlp(embed_dim: int = 768):
    """LAION improved-aesthetic-predictor MLP (github.com/christophschuhmann/improved-aesthetic-predictor).

    Keys `layers.{0,2,4,6,7}.{weight,bias}`; no activations, as in the released model.
    """
    from torch import nn

    return nn.ModuleDict({"layers": nn.Sequential(
        nn.Linear(embed_dim, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
        nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))})


@register("aesthetic", factory=True)
def aesthetic(checkpoint: str | None = None, model: str = "ViT-L-14", pretrained: str | None = "openai",
              model_config: dict | None = None, device: str = "cpu", dtype: str = "float32", batch_size: int = 32):
    """LAION aesthetic score (about 1-10 for real weights): MLP on the L2-normalised CLIP image embedding.

    As in DDPO's aesthetic reward; the prompt is ignored. `checkpoint` holds the MLP weights
    (.pth or .safetensors), e.g. sac+logos+ava1-l14-linearMSE.pth; its input size must equal the
    CLIP model's embedding size.
    """
    import torch

    if checkpoint is None:
        raise ValueError("aesthetic needs checkpoint=PATH to the MLP weights, e.g. sac+logos+ava1-l14-linearMSE.pth "
                         "from github.com/christophschuhmann/improved-aesthetic-predictor")
    net, preprocess, _ = _open_clip(model, pretrained, model_config, device, dtype)
    embed_dim = net.visual.output_dim
    state = _load_state_dict(checkpoint)
    if "layers.0.weight" not in state or state["layers.0.weight"].shape[1] != embed_dim:
        found = tuple(state["layers.0.weight"].shape) if "layers.0.weight" in state else sorted(state)[:5]
        raise ValueError(f"aesthetic checkpoint {checkpoint!r} does not fit: need layers.0.weight of shape "
                         f"[1024, {embed_dim}] (CLIP {model!r} embedding size), found {found}")
    mlp = aesthetic_mlp(embed_dim)
    mlp.load_state_dict(state)
    mlp = align_weights(mlp.to(device).eval())

    @torch.no_grad()
    def score(batch):
        img, _ = _clip_embeds(net, preprocess, None, batch, device, with_text=False)  # [B, D]
        return mlp["layers"](img).squeeze(-1).tolist()                                # [B]

    return _image_reward("aesthetic", score, batch_size)
