"""FLUX.1 (FluxTransformer2DModel, flow matching) as in FluxPipeline.

FLUX.1-dev is guidance-distilled: no CFG forward, `guidance_scale` is fed to the guidance embedding
(3.5 for dev); a transformer without `guidance_embeds` (schnell) gets none. Latents live packed,
[B, (h/2)(w/2), 4C] (the pipeline's `_pack_latents`), and are unpacked only to decode. The sigmas are
linspace(1, 1/S, S) with the resolution-dependent shift mu (`calculate_shift`), as the pipeline does.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from diffusion.families.common import Cond, PipelineFamily, Schedule, flow_schedule, stack, weight_dtype

# diffusers' train_dreambooth_lora_flux default targets (double-stream attention and MLPs)
LORA_TARGETS = ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                "ff_context.net.2"]


class FluxFamily(PipelineFamily):
    name = "flux"
    lora_prefix = "transformer"   # key prefix of diffusers' FluxLoraLoaderMixin
    uses_cfg = False

    def __init__(self, pipe, opts):
        super().__init__(pipe, opts, pipe.transformer, pipe.default_sample_size)
        f = pipe.vae_scale_factor
        # latent grid: the VAE compresses by f and packing needs even sizes (FluxPipeline.prepare_latents)
        self.h, self.w = 2 * (self.height // (f * 2)), 2 * (self.width // (f * 2))
        self.img_ids = pipe._prepare_latent_image_ids(1, self.h // 2, self.w // 2, self.device, torch.float32)

    @staticmethod
    def load(model: str, opts):
        from diffusers import FluxPipeline

        return FluxPipeline.from_pretrained(model, torch_dtype=opts.dtype, revision=opts.revision, variant=opts.variant)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> list[Cond]:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=self.device, num_images_per_prompt=1,
            max_sequence_length=self.opts.max_sequence_length)
        return [Cond(p, {"embeds": embeds[i], "pooled": pooled[i]}) for i, p in enumerate(prompts)]

    def schedule(self, num_steps: int, rule: str) -> Schedule:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        c = self.pipe.scheduler.config
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        kwargs = {"sigmas": sigmas}
        if c.get("use_dynamic_shifting", False):
            seq = (self.h // 2) * (self.w // 2)
            kwargs["mu"] = calculate_shift(seq, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                                           c.get("base_shift", 0.5), c.get("max_shift", 1.15))
        sched = flow_schedule(self.pipe.scheduler, None, rule, self.device, **kwargs)
        return dataclasses.replace(sched, model_t=sched.model_t / 1000)      # the pipeline passes t / 1000

    def latent_grid(self) -> tuple[int, int, int]:
        return self.denoiser.config.in_channels // 4, self.h, self.w

    def pack(self, z: torch.Tensor) -> torch.Tensor:
        n, c, h, w = z.shape
        return self.pipe._pack_latents(z, n, c, h, w)                        # [n, (h/2)(w/2), 4C]

    def unpack(self, latents: torch.Tensor) -> torch.Tensor:
        return self.pipe._unpack_latents(latents, self.height, self.width, self.pipe.vae_scale_factor)  # [B, C, h, w]

    def model_rows(self, x, index, conds, sched: Schedule, guidance: float) -> dict:
        rows = {"hidden_states": x, "timestep": sched.model_t[index],
                "encoder_hidden_states": stack(conds, "embeds"), "pooled_projections": stack(conds, "pooled")}
        if self.denoiser.config.guidance_embeds:
            rows["guidance"] = torch.full((x.shape[0],), float(guidance), device=x.device)
        return rows

    def forward(self, model, rows: dict) -> torch.Tensor:
        dtype = weight_dtype(self.denoiser)
        txt_ids = torch.zeros(rows["encoder_hidden_states"].shape[1], 3, device=self.device)  # [L, 3], as encode_prompt
        return model(hidden_states=rows["hidden_states"].to(dtype), timestep=rows["timestep"].to(dtype),
                     guidance=rows.get("guidance"), pooled_projections=rows["pooled_projections"].to(dtype),
                     encoder_hidden_states=rows["encoder_hidden_states"].to(dtype), txt_ids=txt_ids.to(dtype),
                     img_ids=self.img_ids.to(dtype), return_dict=False)[0]
