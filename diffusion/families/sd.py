"""Stable Diffusion 1.x / 2.x (UNet2DConditionModel; epsilon or v-prediction) with DDIM-SDE steps,
as in StableDiffusionPipeline + DDIMScheduler (DDPO, arXiv 2305.13301).

The checkpoint's scheduler config is turned into a DDIMScheduler; its `set_timesteps` gives the
integer timesteps t_i, and t_prev = t_i - num_train_timesteps // S (DDIMScheduler.step), so that
alpha_prod_prev is alphas_cumprod[t_prev], or the final alpha (1 with set_alpha_to_one, else
alphas_cumprod[0]) past the end. The safety checker is not loaded.
"""

from __future__ import annotations

import torch

from diffusion.families.common import Cond, PipelineFamily, Schedule, stack, weight_dtype

LORA_TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]  # ddpo-pytorch / diffusers train_text_to_image_lora
PREDICTION_TYPES = ("epsilon", "v_prediction")


class SDFamily(PipelineFamily):
    name = "sd"
    lora_prefix = "unet"   # key prefix of diffusers' StableDiffusionLoraLoaderMixin
    uses_cfg = True
    vae_shift = False     # StableDiffusionPipeline decodes latents / scaling_factor

    def __init__(self, pipe, opts):
        from diffusers import DDIMScheduler

        self.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
        self.prediction_type = opts.prediction_type or self.scheduler.config.prediction_type
        if self.prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"config key 'policy.prediction_type' must be one of {', '.join(PREDICTION_TYPES)} "
                             f"for SD models; the checkpoint says {self.prediction_type!r}")
        super().__init__(pipe, opts, pipe.unet, pipe.unet.config.sample_size)

    @staticmethod
    def load(model: str, opts):
        from diffusers import StableDiffusionPipeline

        return StableDiffusionPipeline.from_pretrained(model, torch_dtype=opts.dtype, revision=opts.revision,
                                                       variant=opts.variant, safety_checker=None,
                                                       requires_safety_checker=False)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> list[Cond]:
        embeds, _ = self.pipe.encode_prompt(prompts, self.device, 1, False)   # [P, L, D]
        return [Cond(p, {"embeds": embeds[i]}) for i, p in enumerate(prompts)]

    def schedule(self, num_steps: int, rule: str) -> Schedule:
        """DDIM schedule; `rule` (the flow SDE schedule) does not apply, the prediction type does."""
        s = self.scheduler
        s.set_timesteps(num_steps, device="cpu")
        t = s.timesteps.long()                                                 # [S]
        prev = t - s.config.num_train_timesteps // num_steps                   # [S]
        alphas = s.alphas_cumprod.float()                                      # [num_train_timesteps]
        a_t = alphas[t]
        a_p = torch.where(prev >= 0, alphas[prev.clamp(min=0)], torch.as_tensor(float(s.final_alpha_cumprod)))
        dev = self.device
        return Schedule(self.prediction_type, t.to(dev), a_t.to(dev), a_p.float().to(dev))

    def model_rows(self, x, index, conds, sched: Schedule, guidance: float) -> dict:
        return {"sample": x, "timestep": sched.model_t[index], "encoder_hidden_states": stack(conds, "embeds")}

    def forward(self, model, rows: dict) -> torch.Tensor:
        dtype = weight_dtype(self.denoiser)
        return model(rows["sample"].to(dtype), rows["timestep"],
                     encoder_hidden_states=rows["encoder_hidden_states"].to(dtype), return_dict=False)[0]
