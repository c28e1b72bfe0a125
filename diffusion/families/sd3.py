"""Stable Diffusion 3 / 3.5 (SD3Transformer2DModel, flow matching) as in StableDiffusion3Pipeline.

Prompts are encoded by the pipeline's own `encode_prompt` (two CLIPs + T5); CFG concatenates the
unconditional rows (the encoded negative prompt, computed once) before the conditional ones, as the
pipeline does; latents are decoded with `(z / scaling_factor) + shift_factor`. Pixel-space pipelines
(assets/tiny/shapes_t2i) hold diffusion.pixel.PixelAutoencoder, an identity VAE, in the VAE slot;
diffusers loads a component from a non-diffusers module only once it is imported, so `load` imports it.
"""

from __future__ import annotations

import torch

from diffusion.families.common import Cond, PipelineFamily, Schedule, flow_schedule, stack, weight_dtype

# Flow-GRPO's SD3.5 LoRA targets (attention of both streams; diffusers' train_dreambooth_lora_sd3)
LORA_TARGETS = ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
                "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out"]


class SD3Family(PipelineFamily):
    name = "sd3"
    lora_prefix = "transformer"   # key prefix of diffusers' SD3LoraLoaderMixin
    uses_cfg = True

    def __init__(self, pipe, opts):
        super().__init__(pipe, opts, pipe.transformer, pipe.default_sample_size)

    @staticmethod
    def load(model: str, opts):
        from diffusers import StableDiffusion3Pipeline

        import diffusion.pixel  # noqa: F401  (makes PixelAutoencoder loadable for pixel-space pipelines)

        return StableDiffusion3Pipeline.from_pretrained(model, torch_dtype=opts.dtype, revision=opts.revision,
                                                        variant=opts.variant)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> list[Cond]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, prompt_3=None, device=self.device, num_images_per_prompt=1,
            do_classifier_free_guidance=False, max_sequence_length=self.opts.max_sequence_length)
        return [Cond(p, {"embeds": embeds[i], "pooled": pooled[i]}) for i, p in enumerate(prompts)]

    def schedule(self, num_steps: int, rule: str) -> Schedule:
        return flow_schedule(self.pipe.scheduler, num_steps, rule, self.device)

    def model_rows(self, x, index, conds, sched: Schedule, guidance: float) -> dict:
        return {"hidden_states": x, "timestep": sched.model_t[index],
                "encoder_hidden_states": stack(conds, "embeds"), "pooled_projections": stack(conds, "pooled")}

    def forward(self, model, rows: dict) -> torch.Tensor:
        dtype = weight_dtype(self.denoiser)
        return model(hidden_states=rows["hidden_states"].to(dtype), timestep=rows["timestep"],
                     encoder_hidden_states=rows["encoder_hidden_states"].to(dtype),
                     pooled_projections=rows["pooled_projections"].to(dtype), return_dict=False)[0]
