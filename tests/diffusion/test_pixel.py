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
