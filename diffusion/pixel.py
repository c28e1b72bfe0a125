"""Identity autoencoders, so a diffusers latent pipeline runs in pixel space (images, and videos for Wan).

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
from diffusers import AutoencoderKL, AutoencoderKLWan
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


class PixelVideoAutoencoder(AutoencoderKLWan):
    """Identity video VAE for WanPipeline: latents are the frames themselves, [B, 3, F, H, W] in [-1, 1].

    Its config has what WanPipeline and the wan family read: `scale_factor_temporal` and `scale_factor_spatial`
    1 (F frames are F latent frames; no spatial compression), `z_dim` 3, `latents_mean` 0 and `latents_std` 1
    (decoding's `z * std + mean` is the identity). Like `PixelAutoencoder` it builds none of its parent's layers
    (the parent class only keeps `from_pretrained` from warning about the component's type) and has no weights
    but one scalar buffer; diffusers imports this module to load it.
    """

    _supports_gradient_checkpointing = False
    _no_split_modules = []
    _group_offload_block_modules = []

    @register_to_config
    def __init__(self, z_dim: int = 3, scale_factor_temporal: int = 1, scale_factor_spatial: int = 1,
                 latents_mean: tuple = (0.0, 0.0, 0.0), latents_std: tuple = (1.0, 1.0, 1.0)):
        ModelMixin.__init__(self)  # not AutoencoderKLWan.__init__: no encoder or decoder to build
        self.use_slicing = self.use_tiling = False
        if (z_dim, scale_factor_temporal, scale_factor_spatial) != (3, 1, 1) or \
                list(latents_mean) != [0.0] * 3 or list(latents_std) != [1.0] * 3:
            raise ValueError("PixelVideoAutoencoder is the identity: z_dim 3, scale factors 1, latents_mean 0 and "
                             f"latents_std 1; got {z_dim}, {scale_factor_temporal}, {scale_factor_spatial}, "
                             f"{list(latents_mean)}, {list(latents_std)}")
        self.register_buffer("anchor", torch.zeros(()))

    def encode(self, x: torch.Tensor, return_dict: bool = True):
        """[B, 3, F, H, W] frames in [-1, 1] -> a deterministic latent distribution centred on them."""
        dist = DiagonalGaussianDistribution(torch.cat([x, torch.zeros_like(x)], dim=1), deterministic=True)
        return AutoencoderKLOutput(latent_dist=dist) if return_dict else (dist,)

    def decode(self, z: torch.Tensor, return_dict: bool = True):
        """[B, 3, F, H, W] latents -> the same tensor as the frames, clamped to [-1, 1] as the Wan VAE's output is."""
        out = z.clamp(-1.0, 1.0)
        return DecoderOutput(sample=out) if return_dict else (out,)

    def forward(self, sample: torch.Tensor, return_dict: bool = True):
        return self.decode(sample, return_dict=return_dict)
