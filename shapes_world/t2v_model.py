"""The shapes-world text-to-video model: a tiny pixel-space Wan 2.1 pipeline, untrained.

`WanPipeline` with every component shrunk: a `WanTransformer3DModel` over 5-frame 16 x 16 RGB clips as "latents"
(pixels in [-1, 1], [B, 3, 5, 16, 16]; patches of 1 x 4 x 4 -> 16 tokens per frame, 80 per clip),
`PixelVideoAutoencoder` in the VAE slot (identity, diffusion/pixel.py), a tiny UMT5 encoder over a WordLevel
vocabulary of the moving-shapes prompts (shapes_world/motion.py), the UniPC flow scheduler of the released Wan
checkpoints. It is the model of the text-to-video CPU default (configs/tiny/t2v_shapes.yaml), pretrained by
`python -m shapes_world.pretrain_t2v` into assets/tiny/shapes_t2v.
"""

from __future__ import annotations

import torch

from diffusion import tiny
from shapes_world.motion import t2v_prompt_space

SIZE, FRAMES, STEP = 16, 5, 2   # clips of 5 frames of 16 x 16 pixels, shapes (4 px) moving 2 px per frame
FPS = 4.0                       # a clip plays in just over a second
TEXT_LEN = 8                    # tokens: the longest prompt has 5 words, plus <eos>
T5_WIDTH = 64
TRANSFORMER = dict(patch_size=(1, 4, 4), num_attention_heads=4, attention_head_dim=24, in_channels=3, out_channels=3,
                   text_dim=T5_WIDTH, freq_dim=256, ffn_dim=256, num_layers=4, cross_attn_norm=True,
                   qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
SHIFT = 3.0                     # the scheduler's flow shift (Wan's at 480P) and the pretraining sigmas' shift


def vocab() -> dict[str, int]:
    """Word -> id: tiny.SPECIAL (ids 0..3), then every word of the moving-shapes prompts."""
    words = sorted({w for r in t2v_prompt_space() for w in r["prompt"].split()})
    return {w: i for i, w in enumerate(tiny.SPECIAL + words)}


def build(seed: int = 0):
    """The untrained pixel-space Wan pipeline (weights drawn under `seed`; the caller's RNG untouched)."""
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    from diffusion.pixel import PixelVideoAutoencoder

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        words = vocab()
        return WanPipeline(
            tokenizer=tiny.tokenizer(TEXT_LEN, False, words),
            text_encoder=tiny.t5(T5_WIDTH, len(words), d_kv=16, layers=2, heads=4, umt5=True),
            vae=PixelVideoAutoencoder(),
            scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                              flow_shift=SHIFT),
            transformer=WanTransformer3DModel(**TRANSFORMER))
