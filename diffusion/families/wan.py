"""Wan 2.1 text-to-video (WanTransformer3DModel, flow matching) as in WanPipeline.

A sample is a video: latents [B, C, F', h, w] with F' = (F - 1) / 4 + 1 latent frames for F frames (the VAE
compresses time by 4 after the first frame, space by 8). The SDE steps and their log-probs are the flow-matching
ones of every flow family, over the whole video latent (log-probs averaged over all its elements, as Flow-GRPO's
Wan trainer does).

- Prompts: the pipeline's own `encode_prompt` (one T5 / UMT5 encoder), each prompt's embeddings zero-padded to
  `max_sequence_length` (512 in the pipeline; the transformer gets no mask, so the padding length is part of the
  conditioning and a recipe keeps the pipeline's 512).
- CFG: two forwards, the encoded negative prompt's and the prompt's, `uncond + g (cond - uncond)`, as the
  pipeline does (`common.predict` batches them as 2B rows).
- Schedule: the sigmas and timesteps of the pipeline's scheduler after `set_timesteps(S)`. The released
  checkpoints ship UniPCMultistepScheduler with flow sigmas (flow_shift 3.0 at 480P, 5.0 at 720P): its sigmas and
  integer timesteps are taken as they are, and the step is this package's SDE (Euler at noise level 0), as in
  Flow-GRPO's Wan trainer, not UniPC's multistep update. With FlowMatchEulerDiscreteScheduler the ODE is the
  pipeline's own loop.
- Decoding: latents * std + mean per channel (the VAE's latents_mean / latents_std), then the VAE, which decodes
  one latent frame at a time with its causal cache (AutoencoderKLWan._decode): memory grows with the clip's side,
  not its length. Clips are decoded `decode_batch` at a time (1 by default for video families).

Wan 2.2's second (low-noise) transformer and its boundary_ratio, and the ti2v model's per-token timesteps
(`expand_timesteps`), are not supported: `load` refuses such a pipeline.
"""

from __future__ import annotations

import torch

from diffusion.families.common import Cond, PipelineFamily, Schedule, flow_schedule, stack, weight_dtype
from rewards.sample import Video

# attention and feed-forward projections of every block (diffusers' Wan LoRA training targets; Flow-GRPO's Wan
# trainer adapts the same attention projections)
LORA_TARGETS = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"]
DEFAULT_SIZE = (480, 832)    # WanPipeline.__call__'s height, width
DEFAULT_FRAMES = 81          # ... and num_frames (5 s at 16 fps)


class WanFamily(PipelineFamily):
    name = "wan"
    lora_prefix = "transformer"   # key prefix of diffusers' WanLoraLoaderMixin
    uses_cfg = True
    video = True

    def __init__(self, pipe, opts):
        if getattr(pipe, "transformer_2", None) is not None or pipe.config.get("expand_timesteps", False):
            raise ValueError("config key 'policy.model': Wan 2.2 pipelines (a second transformer, or per-token "
                             "timesteps) are not supported by the wan family; Wan 2.1 checkpoints are")
        super().__init__(pipe, opts, pipe.transformer, DEFAULT_SIZE)
        t, s = pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial
        self.num_frames = opts.num_frames or DEFAULT_FRAMES
        if (self.num_frames - 1) % t:
            raise ValueError(f"config key 'policy.num_frames': the Wan VAE needs {t}k + 1 frames; got "
                             f"{self.num_frames}")
        side = s * self.denoiser.config.patch_size[1]
        if self.height % side or self.width % side:
            raise ValueError(f"config keys 'policy.height' / 'policy.width' must be multiples of {side} for this "
                             f"Wan model (VAE x{s}, patch {self.denoiser.config.patch_size[1]}); got "
                             f"{self.height} x {self.width}")
        self.latent_frames = (self.num_frames - 1) // t + 1
        z = pipe.vae.config.z_dim
        self.latents_mean = torch.tensor(pipe.vae.config.latents_mean, dtype=torch.float32).view(1, z, 1, 1, 1)
        self.latents_std = torch.tensor(pipe.vae.config.latents_std, dtype=torch.float32).view(1, z, 1, 1, 1)

    @staticmethod
    def load(model: str, opts):
        from diffusers import WanPipeline

        import diffusion.pixel  # noqa: F401  (makes PixelVideoAutoencoder loadable for pixel-space pipelines)

        return WanPipeline.from_pretrained(model, torch_dtype=opts.dtype, revision=opts.revision, variant=opts.variant)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> list[Cond]:
        embeds, _ = self.pipe.encode_prompt(prompt=prompts, do_classifier_free_guidance=False,
                                            num_videos_per_prompt=1, device=self.device,
                                            max_sequence_length=self.opts.max_sequence_length)
        return [Cond(p, {"embeds": embeds[i]}) for i, p in enumerate(prompts)]          # [L, D] each

    def schedule(self, num_steps: int, rule: str) -> Schedule:
        return flow_schedule(self.pipe.scheduler, num_steps, rule, self.device)

    def latent_grid(self) -> tuple[int, ...]:
        s = self.pipe.vae_scale_factor_spatial
        return self.denoiser.config.in_channels, self.latent_frames, self.height // s, self.width // s

    def model_rows(self, x, index, conds, sched: Schedule, guidance: float) -> dict:
        return {"hidden_states": x, "timestep": sched.model_t[index], "encoder_hidden_states": stack(conds, "embeds")}

    def forward(self, model, rows: dict) -> torch.Tensor:
        dtype = weight_dtype(self.denoiser)
        return model(hidden_states=rows["hidden_states"].to(dtype), timestep=rows["timestep"],
                     encoder_hidden_states=rows["encoder_hidden_states"].to(dtype), return_dict=False)[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> list:
        """Latents [B, C, F', h, w] -> B `Video`s of F frames, as the pipeline decodes them."""
        vae = self.pipe.vae
        z = latents.float() * self.latents_std.to(latents.device) + self.latents_mean.to(latents.device)
        video = vae.decode(z.to(vae.dtype), return_dict=False)[0]                # [B, 3, F, H, W] in [-1, 1]
        clips = self.pipe.video_processor.postprocess_video(video.float(), output_type="pil")
        return [Video(frames=frames, fps=self.opts.fps) for frames in clips]
