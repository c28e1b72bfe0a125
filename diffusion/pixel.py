"""An identity autoencoder, so a diffusers latent pipeline runs in pixel space.

`PixelAutoencoder` stands where a pipeline expects its VAE (`AutoencoderKL`): `encode` returns the
image itself as a zero-variance latent distribution, `decode` returns the latents unchanged, and its
config has what the pipelines read (`scaling_factor` 1, `shift_factor` 0, one `block_out_channels`
entry, hence `vae_scale_factor = 2 ** (len - 1) = 1`). The "latents" are then RGB images in [-1, 1]
([B, 3, H, W]) and every family's decoding code (`(z / scaling_factor) + shift_factor`, then
`vae.decode`) works unchanged. It has no weights; diffusers saves it as `["diffusion.pixel",
"PixelAutoencoder"]` in model_index.json and imports this module to load it (mmrl must be installed).

It subclasses `AutoencoderKL` because the pipelines type their `vae` argument as one and
`DiffusionPipeline.from_pretrained` warns about any component of another type, but it builds none
of AutoencoderKL's layers (`__init__` skips AutoencoderKL's own): it overrides the encode/decode/forward
that the pipelines call, and AutoencoderKL's tiling, slicing and QKV fusion do not apply to it.
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL
from diffusers.configuration_utils import register_to_config
from diffusers.models.autoencoders.vae import DecoderOutput, DiagonalGaussianDistribution
from diffusers.models.modeling_outputs import AutoencoderKLOutput
from diffusers.models.modeling_utils import ModelMixin


class PixelAutoencoder(AutoencoderKL):
    """Identity VAE: latents are pixels in [-1, 1]."""

    _supports_gradient_checkpointing = False
    _no_split_modules = []
    _group_offload_block_modules = []

    @register_to_config
    def __init__(self, in_channels: int = 3, latent_channels: int = 3, block_out_channels: tuple = (1,),
                 scaling_factor: float = 1.0, shift_factor: float = 0.0, sample_size: int = 32):
        ModelMixin.__init__(self)  # not AutoencoderKL.__init__: no encoder or decoder to build
        self.use_slicing = self.use_tiling = False
        if in_channels != latent_channels or len(block_out_channels) != 1:
            raise ValueError("PixelAutoencoder is the identity: in_channels must equal latent_channels and "
                             f"block_out_channels have one entry (no downsampling); got {in_channels}, "
                             f"{latent_channels}, {tuple(block_out_channels)}")
        # no weights; one saved scalar buffer gives the module a dtype, a device to follow, and the
        # weights file that diffusers' from_pretrained insists on
        self.register_buffer("anchor", torch.zeros(()))

    def encode(self, x: torch.Tensor, return_dict: bool = True):
        """[B, C, H, W] image in [-1, 1] -> a deterministic latent distribution centred on it."""
        dist = DiagonalGaussianDistribution(torch.cat([x, torch.zeros_like(x)], dim=1), deterministic=True)
        return AutoencoderKLOutput(latent_dist=dist) if return_dict else (dist,)

    def decode(self, z: torch.Tensor, return_dict: bool = True, generator=None):
        """[B, C, H, W] latents -> the same tensor as the image."""
        return DecoderOutput(sample=z) if return_dict else (z,)

    def forward(self, sample: torch.Tensor, return_dict: bool = True):
        return self.decode(sample, return_dict=return_dict)
