"""What every model family shares: the schedule as plain tensors, prompt conditioning, the one
`predict` (classifier-free guidance included), the SDE step, and `PipelineFamily` (the state,
initial noise and VAE decoding the families have in common).

`predict` feeds the denoiser in chunks of exactly `forward_batch` rows (the last chunk padded with
copies of its first row). A row's output then depends only on that row's input and the fixed chunk
size, never on which other rows share its forward or where it sits (matmul kernels are chosen by
shape), so rollout and re-scoring agree bit for bit in fp32 and the on-policy ratio is exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from diffusion.sde import FLOW_SCHEDULES, SDEStep, StepCoefs, ddim_coefs, flow_coefs, gaussian_step


@dataclass(frozen=True)
class Schedule:
    """A sampler of S steps as tensors indexed by integer step i in [0, S) (no timestep lookups).

    rule:      flow_grpo | dance_grpo | linear | cps (flow matching: coef = sigma_i, coef_next = sigma_{i+1})
               or epsilon | v_prediction (DDIM: coef = alphas_cumprod[t_i], coef_next = alpha of t_prev)
    model_t:   [S] the timestep the denoiser is given at step i.
    The step coefficients of each noise level (`coefs`) are computed once, as [S] tables.
    """

    rule: str
    model_t: Tensor     # [S]
    coef: Tensor        # [S] fp32
    coef_next: Tensor   # [S] fp32
    _coefs: dict = field(default_factory=dict, compare=False, repr=False)  # noise level -> ([S] table, per step)

    def __len__(self) -> int:
        return self.model_t.shape[0]

    @property
    def flow(self) -> bool:
        return self.rule in FLOW_SCHEDULES

    def coefs(self, noise_level: float) -> StepCoefs:
        """The [S] step coefficients at `noise_level` (a / eta), computed on the first call."""
        if noise_level not in self._coefs:
            a, b = self.coef.float(), self.coef_next.float()                  # [S], [S]
            span = (float(b[-1]), float(b[0]))                               # (sigma_min, sigma_max): linear
            table = (flow_coefs(a, b, noise_level=noise_level, schedule=self.rule, sigma_range=span) if self.flow
                     else ddim_coefs(a, b, eta=noise_level, prediction_type=self.rule))
            self._coefs[noise_level] = table, table.per_step()
        return self._coefs[noise_level][0]

    def step_coefs(self, noise_level: float) -> list[StepCoefs]:
        """The same coefficients as S steps of 0-dim tensors (what a rollout step multiplies by)."""
        self.coefs(noise_level)
        return self._coefs[noise_level][1]


def sde_step(sched: Schedule, out: Tensor, x: Tensor, index: Tensor, noise_level: float,
             prev_sample: Tensor | None = None, generator: torch.Generator | None = None,
             variance_noise: Tensor | None = None) -> SDEStep:
    """Step rows x [B, ...] at steps `index` [B] with the model output `out` [B, ...] (sample or score)."""
    c = sched.coefs(noise_level).rows(index, x.ndim)                          # [B, 1, ..., 1] each
    return gaussian_step(c, out, x, prev_sample, generator, variance_noise)


def weight_dtype(module) -> torch.dtype:
    """The dtype of a module's first parameter (diffusers' `.dtype` walks every parameter per call)."""
    return next(module.parameters()).dtype


@dataclass(frozen=True)
class Cond:
    """The frozen text encoders' output for one prompt (tensors without a batch dim), computed once
    and shared by reference by the prompt's samples, the rollout and every update."""

    prompt: str
    tensors: dict


class CondBatch:
    """The conditioning of B rows, one `Cond` each, stacked per key on first use: a rollout builds one
    and every denoising step reuses its stacked tensors."""

    def __init__(self, conds: list[Cond]):
        self.conds = list(conds)
        self._stacked: dict[str, Tensor] = {}
        self._with_uncond: CondBatch | None = None

    def __len__(self) -> int:
        return len(self.conds)

    def stack(self, key: str) -> Tensor:
        if key not in self._stacked:
            self._stacked[key] = torch.stack([c.tensors[key] for c in self.conds])  # [B, ...]
        return self._stacked[key]

    def with_uncond(self, uncond: Cond) -> CondBatch:
        """The 2B rows of classifier-free guidance: B unconditional ones, then these."""
        if self._with_uncond is None:
            self._with_uncond = CondBatch([uncond] * len(self.conds) + self.conds)
        return self._with_uncond


def stack(conds: CondBatch | list[Cond], key: str) -> Tensor:
    return (conds if isinstance(conds, CondBatch) else CondBatch(conds)).stack(key)  # [B, ...]


def chunked_forward(forward: Callable[[dict], Tensor], rows: dict, chunk: int) -> Tensor:
    """forward(rows) over batch-first tensors in chunks of exactly `chunk` rows -> [R, ...]."""
    r = next(iter(rows.values())).shape[0]
    if r == chunk:                                                            # exactly one chunk: no copies
        return forward(rows)
    outs = []
    for lo in range(0, r, chunk):
        part = {k: v[lo:lo + chunk] for k, v in rows.items()}
        short = chunk - (min(lo + chunk, r) - lo)
        if short:  # pad with copies of the chunk's first row: same shape, same kernels
            part = {k: torch.cat([v, v[:1].expand(short, *v.shape[1:])]) for k, v in part.items()}
        outs.append(forward(part)[:chunk - short])
    return torch.cat(outs)                                                    # [R, ...]


def predict(family, model, x: Tensor, index: Tensor, conds: list[Cond] | CondBatch, sched: Schedule,
            guidance: float, chunk: int) -> Tensor:
    """The model output at rows x [B, ...], steps `index` [B], fp32; CFG (uncond + w (cond - uncond))
    for families that use it when guidance > 1 (as in the diffusers pipelines)."""
    conds = conds if isinstance(conds, CondBatch) else CondBatch(conds)
    cfg = family.uses_cfg and guidance > 1.0
    if cfg:
        x, index, conds = torch.cat([x, x]), torch.cat([index, index]), conds.with_uncond(family.uncond)
    rows = family.model_rows(x, index, conds, sched, guidance)
    out = chunked_forward(lambda part: family.forward(model, part).float(), rows, chunk)  # [B or 2B, ...]
    if cfg:
        uncond, text = out.chunk(2)                                           # [B, ...] each
        out = uncond + guidance * (text - uncond)
    return out


def flow_schedule(scheduler, num_steps: int, rule: str, device, **set_kwargs) -> Schedule:
    """Flow-matching schedule from a FlowMatchEulerDiscreteScheduler (shift / dynamic shift applied)."""
    scheduler.set_timesteps(num_steps, device="cpu", **set_kwargs)
    sigmas = scheduler.sigmas.float()                                         # [S + 1], sigmas[S] = 0
    return Schedule(rule, scheduler.timesteps.float().to(device), sigmas[:-1].to(device), sigmas[1:].to(device))


def to_pil(pipe, images: Tensor) -> list:
    """Decoded images [B, 3, H, W] in [-1, 1] -> PIL images (the pipeline's image processor)."""
    return pipe.image_processor.postprocess(images.float(), output_type="pil")


class PipelineFamily:
    """The part of a family that is the same for every family: the wrapped pipeline, image size,
    initial noise and VAE decoding. A family module subclasses it within this package and writes
    `load`, `encode`, `schedule`, `model_rows` and `forward`; a family with packed latents (flux)
    overrides `latent_grid`, `pack` and `unpack`.

    Class attributes a family sets: name, lora_prefix, uses_cfg, and `vae_shift` (whether decoding
    adds the VAE's shift_factor after dividing by its scaling_factor, as the family's pipeline does).
    """

    name: str
    lora_prefix: str
    uses_cfg: bool
    vae_shift: bool = True
    video: bool = False           # samples are `rewards.sample.Video`s (decoded a clip at a time by default)
    uncond = None

    def __init__(self, pipe, opts, denoiser, sample_size: int | tuple[int, int]):
        """`sample_size`: the denoiser's default latent side, the default image side being that times the VAE's
        scale factor (as the image pipelines compute it); or the default (height, width) in pixels."""
        self.pipe, self.opts = pipe, opts
        self.denoiser = denoiser
        self.device = opts.device
        if isinstance(sample_size, tuple):
            default_h, default_w = sample_size
        else:
            default_h = default_w = sample_size * pipe.vae_scale_factor
        self.height, self.width = opts.height or default_h, opts.width or default_w
        if self.uses_cfg:  # the encoded negative prompt, computed once
            self.uncond = self.encode([opts.negative_prompt])[0]

    def text_encoders(self) -> list:
        """The pipeline's text encoders (the modules a prompt's `Cond` depends on)."""
        names = ("text_encoder", "text_encoder_2", "text_encoder_3")
        return [m for m in (getattr(self.pipe, n, None) for n in names) if m is not None]

    def latent_grid(self) -> tuple[int, ...]:
        """The shape of one initial latent before packing: (channels, height, width) for images."""
        f = self.pipe.vae_scale_factor
        return self.denoiser.config.in_channels, self.height // f, self.width // f

    def pack(self, z: Tensor) -> Tensor:
        """[n, C, h, w] latents -> the layout the denoiser takes (the identity here)."""
        return z

    def unpack(self, latents: Tensor) -> Tensor:
        """The denoiser's layout -> [n, C, h, w] latents for the VAE (the identity here)."""
        return latents

    def noise(self, n: int, generator: torch.Generator) -> Tensor:
        """Initial latents of n samples, fp32 N(0, 1) (the schedulers' init_noise_sigma is 1)."""
        z = torch.randn((n, *self.latent_grid()), generator=generator, device=self.device,
                        dtype=torch.float32)                                  # [n, C, h, w] or [n, C, F', h, w]
        return self.pack(z)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> list:
        """Latents in the denoiser's layout -> PIL images, through the VAE as the pipeline does it."""
        vae = self.pipe.vae
        z = self.unpack(latents) / vae.config.scaling_factor                  # [B, C, h, w]
        if self.vae_shift:
            z = z + vae.config.shift_factor
        return to_pil(self.pipe, vae.decode(z.to(vae.dtype), return_dict=False)[0])
