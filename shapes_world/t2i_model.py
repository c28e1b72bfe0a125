"""The shapes-world text-to-image model: a tiny pixel-space SD3 pipeline, untrained.

`StableDiffusion3Pipeline` with every component shrunk: an `SD3Transformer2DModel` over 32x32 RGB
"latents" (pixels in [-1, 1], patches of 4x4 -> 64 image tokens), `PixelAutoencoder` in the VAE slot
(identity, diffusion/pixel.py), two tiny CLIP text encoders and a tiny T5 over a WordLevel vocabulary
of the shapes prompts (shapes_world/tasks.py), built offline with `tokenizers` from the recipes of
diffusion/tiny.py. SD3's text conditioning is kept as is: the two CLIPs' hidden states are
concatenated (2 x 32 = 64 = T5's width = joint_attention_dim) and their pooled projections form the
pooled embedding (2 x 32 = 64).
`shapes_world.pretrain_t2i` trains it; assets/tiny/shapes_t2i holds the result.
"""

from __future__ import annotations

import torch

from diffusion import tiny
from shapes_world.tasks import t2i_prompt_space

IMAGE_SIZE = 32            # pixels; the latents are [B, 3, 32, 32]
TEXT_LEN = 8               # tokens: the longest prompt has 6 words, plus <bos> and <eos>
CLIP_HIDDEN, CLIP_PROJ, T5_WIDTH = 32, 32, 64
TRANSFORMER = dict(sample_size=IMAGE_SIZE, patch_size=4, in_channels=3, out_channels=3, num_layers=4,
                   attention_head_dim=24, num_attention_heads=4, joint_attention_dim=2 * CLIP_HIDDEN,
                   caption_projection_dim=96, pooled_projection_dim=2 * CLIP_PROJ,
                   pos_embed_max_size=IMAGE_SIZE // 4)
SHIFT = 3.0                # timestep shift of the scheduler and of the pretraining sigmas (SD3's, toward noise)


def vocab() -> dict[str, int]:
    """Word -> id: tiny.SPECIAL (ids 0..3), then every word of the shapes prompt space (counts up to 4)."""
    words = sorted({w for r in t2i_prompt_space(max_count=4) for w in r["prompt"].split()})
    return {w: i for i, w in enumerate(tiny.SPECIAL + words)}


def _clip():
    from transformers import CLIPTextModelWithProjection

    return CLIPTextModelWithProjection(tiny.clip_config(CLIP_HIDDEN, CLIP_PROJ, len(vocab()), TEXT_LEN))


def _t5():
    return tiny.t5(T5_WIDTH, len(vocab()), d_kv=16, layers=2, heads=4)


def build(seed: int = 0):
    """The untrained pixel-space SD3 pipeline (weights drawn under `seed`; the caller's RNG untouched)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    from diffusion.pixel import PixelAutoencoder

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        words = vocab()
        return StableDiffusion3Pipeline(
            transformer=SD3Transformer2DModel(**TRANSFORMER), scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT),
            vae=PixelAutoencoder(sample_size=IMAGE_SIZE),
            text_encoder=_clip(), tokenizer=tiny.tokenizer(TEXT_LEN, True, words),
            text_encoder_2=_clip(), tokenizer_2=tiny.tokenizer(TEXT_LEN, True, words),
            text_encoder_3=_t5(), tokenizer_3=tiny.tokenizer(TEXT_LEN, False, words))
