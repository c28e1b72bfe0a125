"""The shapes-world VLM: a tiny Qwen2.5-VL with a tokenizer over the words of the shapes world.

Built offline, in code, with a fixed seed from the recipes of `vlm/tiny.py` (the same tokenizer,
processor and config recipe as `tiny:qwen2_5_vl`, with its own corpus and a few sizes changed), then
briefly pretrained by `python -m shapes_world.pretrain_vlm` and committed as `assets/tiny/shapes_vlm`.

Prompt and target layout shared by pretraining and RL (`configs/tiny/vlm_shapes.yaml`):
  policy.format_prompt = FORMAT_PROMPT, no system prompt (the chat template adds its default),
  the completion is `<answer>{answer}</answer>` then `<|im_end|>`.
Images: a 56x56 scene is upscaled to MODEL_SIDE x MODEL_SIDE (policy.min_pixels = max_pixels =
MODEL_SIDE**2), i.e. 8x8 patches of 14 px merged 2x2 into 16 image tokens.
"""

from __future__ import annotations

import os

import torch

from shapes_world.scene import COLORS, SHAPES
from vlm import tiny

FORMAT_PROMPT = "{prompt} Reply as <answer> answer </answer>."
MODEL_SIDE = 112
VOCAB_SIZE = 420


def corpus() -> list[str]:
    """Every word the shapes questions, answers and chat template use (the BPE training text)."""
    lines = ["system user assistant You are a helpful assistant.", FORMAT_PROMPT.replace("{prompt}", ""),
             "Answer yes or no. [x1, y1, x2, y2] Give the bounding box of the"]
    lines += ["yes", "no"] + [str(d) for d in range(10)] + list(COLORS)   # answers: one token each
    for color in COLORS:
        lines.append(f"How many {color} shapes are in the image? {color}")
        for kind in SHAPES:
            lines.append(f"What colour is the {kind}? Is the {color} {kind} left of the {color} {kind}?")
    return lines


def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A deterministic byte-level BPE over `corpus()`; chat specials first, then the R1 tags."""
    return tiny.qwen2_5_vl_tokenizer(corpus(), vocab_size)


def build(seed: int = 0, tokenizer=None, max_positions: int = 512, vision: dict | None = None,
          text: dict | None = None):
    """(model, processor): a randomly initialised tiny Qwen2.5-VL and its processor, over `tokenizer`
    (default: the shapes world's, `build_tokenizer()`); `vision` and `text` replace entries of the vision and
    language model configs."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    tok = tokenizer if tokenizer is not None else build_tokenizer()
    processor = tiny.qwen2_5_vl_processor(tok, MODEL_SIDE * MODEL_SIDE, MODEL_SIDE * MODEL_SIDE)
    cfg = tiny.qwen2_5_vl_config(tok, text=dict(max_position_embeddings=max_positions, tie_word_embeddings=True,
                                                **(text or {})),
                                 vision={"intermediate_size": 256, "window_size": MODEL_SIDE,
                                         "fullatt_block_indexes": [0, 1], **(vision or {})})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    tiny.set_generation_ids(model, tok)
    return model, processor


def save(model, processor, folder: str) -> str:
    """save_pretrained (safetensors) the model and its processor into `folder`."""
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
