"""PixelAutoencoder: the identity VAE that lets a diffusers latent pipeline run in pixel space."""

import logging
import os
import warnings

import pytest
import torch

from diffusion.pixel import PixelAutoencoder


def test_encode_and_decode_are_the_identity(tmp_path):
    vae = PixelAutoencoder(sample_size=8)
    x = torch.rand(2, 3, 8, 8) * 2 - 1                                   # [B, 3, H, W] in [-1, 1]
    dist = vae.encode(x).latent_dist
    assert torch.equal(dist.mode(), x) and torch.equal(dist.sample(), x)  # zero variance
    assert torch.equal(vae.decode(x).sample, x) and torch.equal(vae.decode(x, return_dict=False)[0], x)
    vae.save_pretrained(tmp_path)
    again = PixelAutoencoder.from_pretrained(tmp_path)
    assert again.config.scaling_factor == 1.0 and again.config.shift_factor == 0.0
    assert 2 ** (len(again.config.block_out_channels) - 1) == 1            # the pipelines' vae_scale_factor


def test_a_non_identity_config_is_refused():
    with pytest.raises(ValueError, match="in_channels must equal latent_channels"):
        PixelAutoencoder(in_channels=3, latent_channels=4)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_loading_the_pixel_space_asset_is_silent(repo_root):
    """No Python warning and no diffusers/transformers log warning (their loggers do not propagate,
    so a handler is attached to each) when the T2I default's asset loads."""
    from diffusion import families

    handler, loggers = _Records(), [logging.getLogger(n) for n in ("diffusers", "transformers")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            family = families.load("sd3", os.path.join(repo_root, "assets", "tiny", "shapes_t2i"),
                                   families.FamilyOptions(device=torch.device("cpu"), dtype=torch.float32))
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert isinstance(family.pipe.vae, PixelAutoencoder) and family.pipe.vae_scale_factor == 1
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in handler.records if r.levelno >= logging.WARNING] == []


def test_the_video_autoencoder_is_the_identity_wan_reads_as_such(tmp_path):
    """PixelVideoAutoencoder: frames are latents (clamped to [-1, 1] as the Wan VAE's output); WanPipeline and the
    wan family read scale factors 1, z_dim 3, mean 0, std 1; it saves and loads through from_pretrained."""
    from diffusion.pixel import PixelVideoAutoencoder
    from shapes_world import t2v_model

    vae = PixelVideoAutoencoder()
    x = torch.rand(2, 3, 5, 8, 8) * 2 - 1                                # [B, 3, F, H, W] in [-1, 1]
    assert torch.equal(vae.encode(x).latent_dist.mode(), x) and torch.equal(vae.decode(x).sample, x)
    assert torch.equal(vae.decode(3 * x, return_dict=False)[0], (3 * x).clamp(-1, 1))
    with pytest.raises(ValueError, match="PixelVideoAutoencoder is the identity"):
        PixelVideoAutoencoder(scale_factor_temporal=4)
    pipe = t2v_model.build(0)
    pipe.save_pretrained(tmp_path)
    from diffusion import families

    family = families.load("wan", str(tmp_path), families.FamilyOptions(device=torch.device("cpu"), dtype=torch.float32,
                                                                        height=16, width=16, num_frames=5))
    assert isinstance(family.pipe.vae, PixelVideoAutoencoder) and family.latent_grid() == (3, 5, 16, 16)
    z = family.noise(1, torch.Generator().manual_seed(0)).clamp(-1, 1)   # [1, 3, 5, 16, 16]
    (clip,) = family.decode(z)
    want = ((z[0, :, 2].permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
    import numpy as np

    assert len(clip) == 5 and np.abs(np.asarray(clip.frames[2], dtype=int) - want.astype(int)).max() <= 1
