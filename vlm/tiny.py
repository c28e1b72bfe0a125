"""Tiny vision-language models built offline, in code, with a fixed seed (for tests and CPU configs).

`policy.model: tiny:<family>` names one of them; `resolve_model` builds it once into the tiny-model
cache (mmrl/testing/tiny.py: `$MMRL_TINY_CACHE`, shared with the diffusion adapter) with `save_pretrained`
and returns that folder, so the policy then loads it with `from_pretrained` exactly like a real
checkpoint (the real code path). Tests may also call `build(family, folder)` and pass the folder as `policy.model`.

Families (each a real transformers architecture, tokenizer and processor included):
  qwen2_5_vl  Qwen2_5_VLForConditionalGeneration + Qwen2_5_VLProcessor; text hidden 128 with 4 heads
              (head dim 32, mrope_section [4, 6, 6]: the vLLM CPU attention backend needs head dim >= 32).
  llava       LlavaForConditionalGeneration (CLIP vision tower + Llama) + LlavaProcessor, 28x28 images.
The tokenizer is a byte-level BPE trained on a fixed corpus (deterministic), with the family's
special tokens and the R1 tags `<think>`, `</think>`, `<answer>`, `</answer>` as single tokens.
The Qwen2.5-VL recipes (`qwen2_5_vl_tokenizer`, `qwen2_5_vl_processor`, `qwen2_5_vl_config`,
`set_generation_ids`) are also what the shapes-world VLM is built from (shapes_world/vlm_model.py).
"""

from __future__ import annotations

import os

import torch

from mmrl.testing.tiny import build_once, cache_root

VERSION = "v1"  # bump when a family's build changes, so stale cache folders are not reused
FAMILIES = ("qwen2_5_vl", "llava")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                "<|image_pad|>", "<|video_pad|>"]
R1_TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
_CORPUS = [
    "<think> The image shows 3 objects, so the answer is 3. </think> <answer> 3 </answer>",
    "How many objects are in the image? Count them and answer with a number.",
    "Find the area of the triangle. The angle is 30 degrees and the side is 12.",
    "Locate the red box and give its bounding box [x1, y1, x2, y2] in pixels.",
    "system user assistant You are a helpful assistant. A B C D 0 1 2 3 4 5 6 7 8 9",
]

# Qwen2-VL / Qwen2.5-VL chat template (as published with the Qwen2-VL processors, video branch kept).
QWEN_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# LLaVA-1.5 style template (llava-hf): "USER: <image>\n... ASSISTANT:"; system text goes first.
LLAVA_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set parts = [{'type': 'text', 'text': message['content']}] %}"
    "{% else %}{% set parts = message['content'] %}{% endif %}"
    "{% if message['role'] == 'system' %}{% for c in parts %}{{ c['text'] }}{% endfor %}{{ '\n' }}"
    "{% else %}{{ message['role'].upper() + ': ' }}"
    "{% for c in parts %}{% if c['type'] == 'image' %}{{ '<image>\n' }}{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% if message['role'] == 'assistant' %}{{ '</s>' }}{% endif %}{{ ' ' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def folder_of(family: str) -> str:
    """The cache folder of the built `tiny:<family>` model."""
    return os.path.join(cache_root(), f"{family}-{VERSION}")


def resolve_model(name: str) -> str:
    """`tiny:<family>` -> a cache folder holding the built model (built on first use); else `name`."""
    if not name.startswith("tiny:"):
        return name
    family = name[len("tiny:"):]
    if family not in FAMILIES:
        raise ValueError(f"config key 'policy.model': unknown tiny model {name!r}; valid: "
                         f"{', '.join('tiny:' + f for f in FAMILIES)}")
    folder = folder_of(family)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # save_pretrained writes only on rank 0 of a process group: rank 0 builds, the others wait
        if dist.get_rank() == 0:
            _build_once(family, folder)
        dist.barrier()
    else:
        _build_once(family, folder)
    return folder


def _complete(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, n)) for n in ("config.json", "model.safetensors",
                                                                 "processor_config.json"))


def _build_once(family: str, folder: str) -> None:
    build_once(folder, lambda tmp: build(family, tmp), _complete, f"tiny:{family}")


def bpe(corpus: list[str], special: list[str], vocab_size: int):
    """A deterministic byte-level BPE over `corpus` (four passes) with `special` tokens first (ids 0..),
    then the R1 tags as added tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 4, trainer)
    tok.add_tokens(R1_TAGS)
    return tok


def qwen2_5_vl_tokenizer(corpus: list[str], vocab_size: int):
    """A Qwen-style fast tokenizer over `bpe(corpus, QWEN_SPECIAL, vocab_size)`."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=bpe(corpus, QWEN_SPECIAL, vocab_size), eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", additional_special_tokens=QWEN_SPECIAL[1:])


def qwen2_5_vl_processor(tok, min_pixels: int, max_pixels: int):
    """Qwen2.5-VL processor with `tok`, QWEN_TEMPLATE and images resized to [min_pixels, max_pixels]."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels),
        video_processor=Qwen2VLVideoProcessor(), tokenizer=tok, chat_template=QWEN_TEMPLATE)


def qwen2_5_vl_config(tok, text: dict | None = None, vision: dict | None = None):
    """The tiny Qwen2.5-VL config over `tok`'s vocabulary and special ids; `text` and `vision` replace
    or add entries of the text and vision sub-configs."""
    from transformers import Qwen2_5_VLConfig

    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_SPECIAL}
    text_config = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 10000.0},
                       bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                       pad_token_id=ids["<|endoftext|>"]) | (text or {})
    vision_config = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                         patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                         fullatt_block_indexes=[1]) | (vision or {})
    return Qwen2_5_VLConfig(
        text_config=text_config, vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])


def set_generation_ids(model, tok) -> None:
    """Stop generation at `<|im_end|>` or `<|endoftext|>` and pad with `<|endoftext|>`."""
    end, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    model.generation_config.eos_token_id = [end, pad]
    model.generation_config.pad_token_id = pad


def build(family: str, folder: str, seed: int = 0) -> str:
    """Build the tiny `family` model, tokenizer and processor and save them to `folder`."""
    builders = {"qwen2_5_vl": _build_qwen2_5_vl, "llava": _build_llava}
    if family not in builders:
        raise ValueError(f"unknown tiny family {family!r}; valid: {', '.join(FAMILIES)}")
    os.makedirs(folder, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, processor = builders[family]()
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
    return folder


def _build_qwen2_5_vl():
    from transformers import Qwen2_5_VLForConditionalGeneration

    tok = qwen2_5_vl_tokenizer(_CORPUS, 320)
    processor = qwen2_5_vl_processor(tok, 28 * 28, 28 * 28 * 64)
    model = Qwen2_5_VLForConditionalGeneration(qwen2_5_vl_config(tok))
    set_generation_ids(model, tok)
    return model, processor


def _build_llava():
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor, PreTrainedTokenizerFast)

    special = ["<unk>", "<s>", "</s>", "<pad>", "<image>"]
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe(_CORPUS, special, 320), unk_token="<unk>", bos_token="<s>",
                                  eos_token="</s>", pad_token="<pad>", additional_special_tokens=["<image>"])
    ids = {t: tok.convert_tokens_to_ids(t) for t in special}
    image_processor = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=14,
                               vision_feature_select_strategy="default", chat_template=LLAVA_TEMPLATE,
                               num_additional_image_tokens=1)  # the CLIP CLS token
    cfg = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=2, image_size=28, patch_size=14, projection_dim=64),
        text_config=LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"]),
        image_token_index=ids["<image>"], vision_feature_select_strategy="default", vision_feature_layer=-2,
        pad_token_id=ids["<pad>"])
    model = LlavaForConditionalGeneration(cfg)
    model.generation_config.eos_token_id = ids["</s>"]
    model.generation_config.pad_token_id = ids["<pad>"]
    return model, processor
