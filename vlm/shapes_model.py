"""The shapes-world VLM: a tiny Qwen2.5-VL with a tokenizer over the words of the shapes world.

Built offline, in code, with a fixed seed (like `vlm/tiny.py`), then briefly pretrained by
`python -m vlm.pretrain_shapes` and committed as `assets/tiny/shapes_vlm`.

Prompt and target layout shared by pretraining and RL (`configs/tiny/vlm_shapes.yaml`):
  policy.format_prompt = FORMAT_PROMPT, no system prompt (the chat template adds its default),
  the completion is `<answer>{answer}</answer>` then `<|im_end|>`.
Images: a 56x56 scene is upscaled to MODEL_SIDE x MODEL_SIDE (policy.min_pixels = max_pixels =
MODEL_SIDE**2), i.e. 8x8 patches of 14 px merged 2x2 into 16 image tokens.
"""

from __future__ import annotations

import os

import torch

from rewards.shapes.scene import COLORS, SHAPES
from vlm.tiny import QWEN_TEMPLATE, R1_TAGS

FORMAT_PROMPT = "{prompt} Reply as <answer> answer </answer>."
MODEL_SIDE = 112
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>"]


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


def build_tokenizer(vocab_size: int = 420):
    """A deterministic byte-level BPE over `corpus()`; chat specials first, then the R1 tags."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(corpus() * 4, trainer)
    bpe.add_tokens(R1_TAGS)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL[1:])


def build(seed: int = 0):
    """(model, processor): a randomly initialised tiny Qwen2.5-VL and its processor."""
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor,
                              Qwen2VLImageProcessor, Qwen2VLVideoProcessor)

    tok = build_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL}
    pixels = MODEL_SIDE * MODEL_SIDE
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=pixels, max_pixels=pixels),
        video_processor=Qwen2VLVideoProcessor(), tokenizer=tok, chat_template=QWEN_TEMPLATE)
    cfg = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 10000.0},
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=True),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=256, num_heads=2, out_hidden_size=128,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=MODEL_SIDE,
                           fullatt_block_indexes=[0, 1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return model, processor


def save(model, processor, folder: str) -> str:
    """save_pretrained (safetensors) the model and its processor into `folder`."""
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
