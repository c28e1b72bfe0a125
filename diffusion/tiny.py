"""Tiny diffusers pipelines built in code (the CPU stand-ins for SD3, SD 1.x, FLUX.1 and Wan 2.1).

`policy.model: tiny:<kind>` (kind in TINY_KINDS) names one of them: `ensure(kind)` builds it with a
fixed seed, saves it with `save_pretrained` into a cache folder, and returns that folder, so the tiny
configs exercise the real `from_pretrained(local_folder)` path. Tokenizers are WordLevel vocabularies
over the words of `PROMPTS` (built with the `tokenizers` library, nothing is downloaded). Shapes follow
diffusers' own dummy components (tests/pipelines/*/test_pipeline_*.py), shrunk further.

The cache is the tiny-model cache shared with the VLM adapter (mmrl/testing/tiny.py: $MMRL_TINY_CACHE), one
sub-folder per kind and version of this file; each model is written to a temporary folder and renamed
into place, so concurrent builders never see a half-written model. The tokenizer and text-encoder
recipes (`tokenizer`, `clip_config`, `t5`) are also what the shapes-world text-to-image model is built
from (shapes_world/t2i_model.py).
"""

from __future__ import annotations

import hashlib
import os

import torch

from mmrl.testing.tiny import build_once, cache_root

# the cache folder name carries a hash of this file, so editing a tiny config never reuses a stale build
with open(__file__, "rb") as _f:
    VERSION = hashlib.sha1(_f.read()).hexdigest()[:10]
TINY_KINDS = ("sd3", "sd", "sd_v", "flux", "wan")
PROMPTS = ["a red circle", "a blue square", "a green triangle", "a yellow star",
           "a photo of a cat", "a photo of a dog", "a red square", "a blue circle"]
SPECIAL = ["<pad>", "<unk>", "<bos>", "<eos>"]  # ids 0..3; eos id 3 (not 2: CLIP's legacy argmax pooling)
CLIP_LEN, T5_LEN = 8, 8                         # tokenizer model_max_length


def prompts(split: str = "train") -> list[dict]:
    """Data source for the tiny configs (`data.train: diffusion.tiny:prompts`)."""
    rows = [{"prompt": p} for p in PROMPTS]
    return rows if split == "train" else rows[:4]


def _vocab() -> dict[str, int]:
    words = sorted({w for p in PROMPTS for w in p.split()})
    return {w: i for i, w in enumerate(SPECIAL + words)}


def tokenizer(max_length: int, bos: bool, vocab: dict[str, int] | None = None):
    """A WordLevel tokenizer wrapped as a transformers fast tokenizer ("<bos> words <eos>" or "words <eos>");
    `vocab` (word -> id, starting with SPECIAL) defaults to the words of PROMPTS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab or _vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    single = "<bos> $A <eos>" if bos else "$A <eos>"
    tok.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("<bos>", 2), ("<eos>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>", model_max_length=max_length)


def clip_config(hidden: int, projection: int, vocab_size: int | None = None, max_length: int = CLIP_LEN):
    """A 2-layer CLIP text config over a SPECIAL-first vocabulary (default: the words of PROMPTS)."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(vocab_size=vocab_size or len(_vocab()), hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=max_length,
                          projection_dim=projection, bos_token_id=2, eos_token_id=3, pad_token_id=0)


def t5(d_model: int, vocab_size: int | None = None, d_kv: int = 8, layers: int = 1, heads: int = 2,
       umt5: bool = False):
    """A T5 encoder (UMT5, Wan's, with `umt5`) with random weights over a SPECIAL-first vocabulary (default: the
    words of PROMPTS)."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    config, model = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    return model(config(vocab_size=vocab_size or len(_vocab()), d_model=d_model, d_kv=d_kv,
                        d_ff=2 * d_model, num_layers=layers, num_heads=heads,
                        relative_attention_num_buckets=8, relative_attention_max_distance=16,
                        pad_token_id=0, eos_token_id=3, decoder_start_token_id=0))


def _vae(latent_channels: int, flow: bool):
    from diffusers import AutoencoderKL

    extra = dict(shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False,
                 use_post_quant_conv=False) if flow else dict(scaling_factor=0.18215)
    return AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(4, 4), layers_per_block=1,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         latent_channels=latent_channels, norm_num_groups=2, sample_size=16, **extra)


def _sd3():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    # CLIP hidden 2 x 16 = 32 = T5 d_model = joint_attention_dim (SD3 pads CLIP to the T5 width)
    transformer = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, out_channels=4, num_layers=1,
                                        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                        caption_projection_dim=16, pooled_projection_dim=32, pos_embed_max_size=8)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=_vae(4, flow=True),
        text_encoder=CLIPTextModelWithProjection(clip_config(16, 16)), tokenizer=tokenizer(CLIP_LEN, True),
        text_encoder_2=CLIPTextModelWithProjection(clip_config(16, 16)), tokenizer_2=tokenizer(CLIP_LEN, True),
        text_encoder_3=t5(32), tokenizer_3=tokenizer(T5_LEN, False))


def _sd(prediction_type: str):
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(8, 16), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=16,
                                norm_num_groups=4, attention_head_dim=2)
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1, prediction_type=prediction_type)
    return StableDiffusionPipeline(vae=_vae(4, flow=False), text_encoder=CLIPTextModel(clip_config(16, 16)),
                                   tokenizer=tokenizer(CLIP_LEN, True), unet=unet, scheduler=scheduler,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def _flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    # latents [B, 4, 8, 8] pack 2x2 into [B, 16, 16]; rope axes sum to the head dim (8)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                         attention_head_dim=8, num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=(2, 2, 4))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    return FluxPipeline(scheduler=scheduler, vae=_vae(4, flow=True), transformer=transformer,
                        text_encoder=CLIPTextModel(clip_config(16, 16)), tokenizer=tokenizer(CLIP_LEN, True),
                        text_encoder_2=t5(32), tokenizer_2=tokenizer(T5_LEN, False))


def _wan():
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    # diffusers' own dummy Wan (tests/pipelines/wan/test_wan.py) on this file's tokenizer and T5: the head dim 12
    # splits into even RoPE parts for frames, height and width; the VAE compresses space by 8 and time by 4
    transformer = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12,
                                        in_channels=16, out_channels=16, text_dim=32, freq_dim=256, ffn_dim=32,
                                        num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                        rope_max_seq_len=32)
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True])
    # the released checkpoints' scheduler: UniPC over flow-matching sigmas, shift 3 (480P)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    return WanPipeline(tokenizer=tokenizer(T5_LEN, False), text_encoder=t5(32, umt5=True), vae=vae,
                       scheduler=scheduler, transformer=transformer)


def build(kind: str, seed: int = 0):
    """The tiny pipeline `kind` (random weights drawn under a fixed seed)."""
    if kind not in TINY_KINDS:
        raise ValueError(f"unknown tiny model 'tiny:{kind}'; valid: {', '.join('tiny:' + k for k in TINY_KINDS)}")
    builders = {"sd3": _sd3, "sd": lambda: _sd("epsilon"), "sd_v": lambda: _sd("v_prediction"), "flux": _flux,
                "wan": _wan}
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG (e.g. the run seed) untouched
        torch.manual_seed(seed)
        return builders[kind]()


def folder_of(kind: str, root: str | None = None) -> str:
    """The cache folder of the saved tiny pipeline `kind` (under `root`, default the tiny-model cache)."""
    return os.path.join(root or cache_root(), f"{kind}-v{VERSION}")


def _complete(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "model_index.json"))


def ensure(kind: str, root: str | None = None) -> str:
    """Folder holding the saved tiny pipeline `kind` (built on first use)."""
    return build_once(folder_of(kind, root), lambda tmp: build(kind).save_pretrained(tmp), _complete, f"tiny:{kind}")


def resolve(model: str) -> str:
    """`tiny:<kind>` -> its folder; any other name (hub id, local folder) is returned unchanged."""
    return ensure(model.split(":", 1)[1]) if model.startswith("tiny:") else model
