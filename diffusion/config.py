"""The `policy:` section of the diffusion adapter (`policy.name: diffusion`) and its checks at load,
before any model is built."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from diffusion import families, timesteps
from diffusion.lora import LoraConfig
from diffusion.sde import FLOW_SCHEDULES
from diffusion.timesteps import TimestepsConfig
from mmrl.config import ConfigError


@dataclass(frozen=True)
class Config:
    name: str = "diffusion"
    model: str = "tiny:sd3"               # hub id, local pipeline folder, or tiny:<sd3|sd|sd_v|flux|wan> (tiny.py)
    family: str = "auto"                  # auto (model_index.json) | sd3 | sd | flux | wan
    revision: Optional[str] = None        # hub revision / variant passed to from_pretrained
    variant: Optional[str] = None
    prompt_key: str = "prompt"            # record field holding the prompt text
    negative_prompt: str = ""             # the unconditional prompt of CFG (encoded once)
    height: int = 0                       # image / frame size in pixels; 0 = the model's default
    width: int = 0
    num_frames: int = 0                   # video families (wan): frames per clip (4k + 1); 0 = the model's default
    fps: float = 16.0                     # video families: frame rate of the clips (saved samples, rewards)
    max_sequence_length: int = 256        # T5 tokens (sd3, flux, wan; WanPipeline uses 512)
    prediction_type: Optional[str] = None  # sd: epsilon | v_prediction; None = the scheduler config's
    guidance_scale: float = 4.5           # CFG scale (sd3, sd; <= 1 disables CFG); flux: the guidance embedding
    eval_guidance_scale: Optional[float] = None  # evaluation images' scale; None = guidance_scale (1.0 here with CFG at eval: training without CFG)
    rollout_steps: int = 10               # S, denoising steps of a training rollout (denoising reduction)
    eval_steps: int = 40                  # ODE steps of evaluation images
    sde_schedule: str = "flow_grpo"       # flow families: flow_grpo (g = a sqrt(s/(1-s))) | dance_grpo (g = eta)
                                          # | linear (g = a (s_min + (s_max - s_min) s), Flow-GRPO's Wan, a = 1)
                                          # | cps (coefficient-preserving: std = s' sin(a pi/2))
    noise_level: float = 0.7              # a (flow_grpo; cps, in [0, 1]), eta (dance_grpo), or DDIM eta (sd)
    shared_noise: bool = False            # one initial noise per group (DanceGRPO), seeded from the prompt seed
    timesteps: TimestepsConfig = field(default_factory=TimestepsConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    reference: bool = True                # full fine-tuning: keep a frozen copy for the KL (LoRA needs none)
    gradient_checkpointing: bool = False
    forward_batch: int = 8                # denoiser rows per forward, always exactly this many (padded)
    decode_batch: int = 0                 # VAE rows per decode, always exactly this many (padded); 0 = forward_batch
                                          # (images) or 1 (video families)
    text_cache_size: int = 256            # prompts whose text embeddings are kept (LRU) across steps; 0 = re-encode


def ddim_reweight_error(what: str) -> ConfigError:
    return ConfigError(f"config key 'algo.step_reweight': {what} samples with DDIM, where GRPO-Guard's 1/dt weight "
                       "(a flow-matching step's dt = sigma_i - sigma_{i+1}) is not defined; set algo.step_reweight=false "
                       "(algo.policy_loss=grpo_guard works with every family)")


def validate_guard(cfg: Config, algo) -> None:
    """GRPO-Guard options this section can serve: RatioNorm with every family, the 1/dt reweighting with flow
    families only (checked here when the family is known from the config; else when the model is built)."""
    if algo.step_reweight and families.declared_ddim(cfg.family, cfg.model):
        raise ddim_reweight_error(f"policy.family={cfg.family!r} (model {cfg.model!r})")


def validate(cfg: Config) -> None:
    """Checks of the `policy:` section that need no model (run when the config is loaded)."""
    for key in ("rollout_steps", "eval_steps", "forward_batch"):
        if getattr(cfg, key) < 1:
            raise ValueError(f"config key 'policy.{key}' must be >= 1, got {getattr(cfg, key)}")
    if cfg.decode_batch < 0:
        raise ValueError(f"config key 'policy.decode_batch' must be >= 1, or 0 for forward_batch; "
                         f"got {cfg.decode_batch}")
    if cfg.num_frames < 0:
        raise ValueError(f"config key 'policy.num_frames' must be >= 0 (0 = the model's default); got {cfg.num_frames}")
    if cfg.num_frames and cfg.family in families.FAMILIES and cfg.family not in families.VIDEO_FAMILIES:
        raise ValueError(f"config key 'policy.num_frames' is for video families ({', '.join(families.VIDEO_FAMILIES)}); "
                         f"policy.family={cfg.family!r} generates images: remove it or set it to 0")
    if cfg.fps <= 0:
        raise ValueError(f"config key 'policy.fps' must be > 0; got {cfg.fps}")
    if cfg.text_cache_size < 0:
        raise ValueError(f"config key 'policy.text_cache_size' must be >= 0 (prompts kept; 0 disables the cache), "
                         f"got {cfg.text_cache_size}")
    if cfg.sde_schedule not in FLOW_SCHEDULES:
        raise ValueError(f"config key 'policy.sde_schedule' must be one of {', '.join(FLOW_SCHEDULES)}; "
                         f"got {cfg.sde_schedule!r}")
    if cfg.noise_level < 0:
        raise ValueError(f"config key 'policy.noise_level' must be >= 0, got {cfg.noise_level}")
    if cfg.sde_schedule == "cps" and cfg.noise_level > 1:
        raise ValueError(f"config key 'policy.noise_level' must be in [0, 1] with policy.sde_schedule=cps "
                         f"(std = sigma_next sin(noise_level pi / 2)), got {cfg.noise_level}")
    timesteps.validate(cfg.timesteps, cfg.rollout_steps)


NO_REFERENCE = ("algo.kl_beta != 0 needs a reference model: with full fine-tuning (policy.lora.rank=0) set "
                "policy.reference=true to keep a frozen copy, or set algo.kl_beta=0")
