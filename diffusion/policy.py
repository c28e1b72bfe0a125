"""The diffusion policy: a diffusers text-to-image or text-to-video model whose SDE denoising steps are the actions.

rollout:      G images (video families: clips, `rewards.Video`) per prompt; the log-prob of each trained step (T per
              sample, see timesteps.py)
log_probs:    the same steps re-scored with grad through the one `predict` (ratio exactly 1 on-policy)
KL:           exact Gaussian KL of the SDE step to the reference model's (LoRA disabled, or a frozen
              copy for full fine-tuning, built only when algo.kl_beta != 0): `reference_log_probs` returns
              the reference's SDE-step means as a `Reference` (once per step, before the updates), and
              `log_probs(rollout, index, reference)` turns them into `Scores.kl`; without a reference it
              returns no KL, and its log-probs never depend on whether a reference was computed.
GRPO-Guard:   (arXiv 2510.22319, `mmrl.algorithms.guard`) `log_probs` also returns each step's std s (`Scores.step_std`)
              and, flow families only, its weight 1 / dt with dt = sigma_i - sigma_{i+1} (`Scores.step_weight`);
              built with algo.policy_loss=grpo_guard, the rollout records each trained step's mean mu_old
              (`state["old_mean"]` [N, T, ...]) and `log_probs` returns the drift
              ||mu_theta - mu_old||^2 / (2 D s^2) (`Scores.mean_drift`, the exact Gaussian KL's formula).
prompts:      each encoded alone (batch 1) and kept across steps in an LRU of `text_cache_size` prompts
              (text_cache.py); images decoded `decode_batch` rows per VAE call (padded; clips 1 by default).
SDE check:    a flow schedule whose step would flip the latent (coefficient a <= 0) is refused at build.
save / load:  the trainable weights as one safetensors file (diffusers LoRA format for LoRA).
DiffusionNFT: (arXiv 2509.16117, algo.objective=nft, `diffusion.nft`) the old policy samples the rollouts,
              which keep only the clean latents; `forward_process_loss` and `update_old` serve
              `mmrl.algorithms.objectives.nft`, and the old weights are saved next to the policy's file.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from diffusion import families, nft, timesteps, tiny
from diffusion.config import NO_REFERENCE, Config, ddim_reweight_error, validate, validate_guard  # noqa: F401
from diffusion.families.common import Cond
from diffusion.lora import add_lora, export_lora, load_lora, save_lora
from diffusion.sampler import Denoiser, denoise, rescore, scatter, transitions
from diffusion.sde import gaussian_kl
from diffusion.text_cache import TextCache
from diffusion.timesteps import StepPlan
from mmrl.config import ConfigError
from mmrl.types import ForwardLoss, PromptBatch, Reference, Rollout, Scores
from rewards.sample import Sample


def _dtype(precision: str, device) -> torch.dtype:
    if torch.device(device).type != "cuda":
        return torch.float32  # CPU runs fp32 weights; the step math is fp32 everywhere
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class DiffusionPolicy:
    def __init__(self, cfg: Config, family, accelerator=None):
        self.cfg, self.family, self.acc = cfg, family, accelerator
        self.denoiser = family.denoiser
        self.model = self.denoiser                       # the trainer may replace it with a wrapper
        self.device = family.device
        self.reference_model = None
        self.keep_means = False                          # GRPO-Guard RatioNorm: record the rollout's step means
        self.nft_old = None                              # DiffusionNFT: the old (sampling) policy, nft.OldPolicy
        self._check = None                               # interruptible rollouts: () -> weights version (interrupt_with)
        self.sched = family.schedule(cfg.rollout_steps, cfg.sde_schedule)
        self.eval_sched = family.schedule(cfg.eval_steps, cfg.sde_schedule)
        self.text_cache = TextCache(lambda p: family.encode([p])[0], cfg.text_cache_size, family.text_encoders())
        self.rollout_mode = "gathered"                   # distributed.rollout (mmrl.distributed.sharding.gathered)

    def on_shard(self) -> None:
        """After the trainer sharded the denoiser (distributed.strategy=fsdp): the old policy holds the new
        (sharded) parameters; it is still a copy of the start."""
        if self.nft_old is not None:
            self.nft_old = nft.OldPolicy(self.denoiser)

    def _gathered(self):
        """Sampling with sharded weights (`mmrl.distributed.sharding.gathered`); nothing when the model is not
        sharded."""
        from mmrl.distributed.sharding import gathered

        return gathered(self.model, mode=self.rollout_mode)

    # --- helpers -----------------------------------------------------------------------------
    def _autocast(self):
        return self.acc.autocast() if self.acc is not None else contextlib.nullcontext()

    def _denoiser(self, model, sched, guidance: float | None = None) -> Denoiser:
        scale = self.cfg.guidance_scale if guidance is None else guidance
        return Denoiser(self.family, model, sched, scale, self.cfg.forward_batch)

    def encode(self, prompts: list[str]) -> dict[str, Cond]:
        """The `Cond` of each distinct prompt: encoded alone (batch 1), so that it never depends on which
        other prompts this process holds, and kept across steps (text_cache.py; policy.text_cache_size)."""
        return self.text_cache.get(prompts)

    def _prompt(self, row: dict) -> str:
        if self.cfg.prompt_key not in row:
            raise ConfigError(f"config key 'policy.prompt_key': record has no field {self.cfg.prompt_key!r} "
                             f"(fields: {', '.join(row)})")
        return str(row[self.cfg.prompt_key])

    def _sample(self, row, text, image, sid) -> Sample:
        meta = {k: v for k, v in row.items() if k not in (self.cfg.prompt_key, "answer")}
        return Sample(prompt=text, output=image, answer=row.get("answer"), meta=meta, id=sid)

    # --- rollout -----------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, prompts: PromptBatch, group_size: int) -> Rollout:
        texts = [self._prompt(r) for r in prompts.rows]
        conds = self.encode(texts)
        gens, xs, plans = [], [], []
        for seed in prompts.seeds:                                           # per prompt: its own randomness
            gens.append(torch.Generator(self.device).manual_seed(seed))      # initial noise, then SDE noise
            plans.append(timesteps.plan(self.cfg.timesteps, len(self.sched), group_size, prompts.step,
                                        torch.Generator().manual_seed(seed)))
            x = self.family.noise(1 if self.cfg.shared_noise else group_size, gens[-1])   # [1 or G, ...]
            xs.append(x.expand(group_size, *x.shape[1:]))                                  # [G, ...]
        plan = StepPlan(sde=plans[0].sde, trained=torch.cat([p.trained for p in plans]))  # sde: same for all
        if self.nft_old is not None:                                         # NFT: no trained steps, old weights
            plan = StepPlan(sde=plan.sde, trained=torch.zeros_like(plan.trained))
        cond_rows = [conds[t] for t in texts for _ in range(group_size)]
        sampler = self.nft_old.active() if self.nft_old is not None else contextlib.nullcontext()
        with self._autocast(), sampler, self._gathered():                    # all prompts in one batch
            traj = denoise(self._denoiser(self.model, self.sched), torch.cat(xs).contiguous(), cond_rows, plan,
                           self.cfg.noise_level, gens, keep_means=self.keep_means, between=self._check)
        images, samples = self._decode(traj.final), []
        for p, (row, text) in enumerate(zip(prompts.rows, texts)):
            samples += [self._sample(row, text, im, f"step {prompts.step} prompt {prompts.index[p]} sample {g}")
                        for g, im in enumerate(images[p * group_size:(p + 1) * group_size])]
        group = torch.arange(len(texts)).repeat_interleave(group_size)      # [N]
        if self.nft_old is not None:                                         # one unit per sample: its x0
            return Rollout(samples=samples, log_probs=None, mask=torch.ones(len(samples), 1), group=group,
                           state=nft.rollout_state(traj.final, cond_rows, prompts.seeds, group_size))
        state = {"latents": traj.latents, "before": traj.before, "after": traj.after,
                 "step_index": traj.step_index, "cond": cond_rows}
        if traj.means is not None:
            state["old_mean"] = traj.means                                   # [N, T, ...] mu_old (RatioNorm)
        versions = None
        if traj.step_versions is not None:                                   # interrupted: per trained step
            versions = traj.step_versions[traj.step_index.cpu()]               # [N, T]
        return Rollout(samples=samples, log_probs=traj.log_probs, mask=traj.mask, group=group, state=state,
                       versions=versions)

    def interrupt_with(self, check) -> None:
        """Interruptible rollouts (`mmrl.types.Interruptible`): `check` runs before each denoising step and may
        load newer weights; each trained transition's log-prob is scored with the weights of its step."""
        self._check = check

    def _decode(self, latents: torch.Tensor) -> list:
        """Images (or videos) of latents [B, ...], decoded `decode_batch` rows per call with the last call padded, so
        an image never depends on how many others this process decodes with it (as for the denoiser: on
        CPU fp32 a VAE's output row changes in its last bits with the batch size and the row's position)."""
        k = self.cfg.decode_batch or (1 if self.family.video else self.cfg.forward_batch)
        images = []
        for lo in range(0, latents.shape[0], k):
            part = latents[lo:lo + k]                                         # [<=k, ...]
            pad = part.new_zeros(k - part.shape[0], *part.shape[1:])
            images += self.family.decode(torch.cat([part, pad]))[:part.shape[0]]
        return images

    # --- update ------------------------------------------------------------------------------
    def log_probs(self, rollout: Rollout, index: torch.Tensor, reference: Reference | None = None) -> Scores:
        """Log-probs [n, T] of samples `index` with grad; with `reference` (the `reference_log_probs` of the
        same samples) also the exact KL [n, T] of each step to the reference's step; and the GRPO-Guard
        terms (module docstring)."""
        rows, cols, x, x_next, steps, conds = transitions(rollout.state, rollout.mask, index)
        shape = (index.numel(), rollout.mask.shape[1])
        step = rescore(self._denoiser(self.model, self.sched), x, x_next, steps, conds, self.cfg.noise_level)
        kl = drift = weight = None
        if reference is not None:
            ref_mean = reference.state["mean"].to(step.mean.device)[rows, cols]            # [M, ...]
            kl = scatter(gaussian_kl(step.mean, ref_mean, step.std), rows, cols, shape)    # [n, T]
        if "old_mean" in rollout.state:
            old = rollout.state["old_mean"]                                               # [N, T, ...]
            old_mean = old[index.to(old.device)][rows.to(old.device), cols.to(old.device)].to(step.mean.device)  # [M, ...]
            drift = scatter(gaussian_kl(step.mean, old_mean, step.std), rows, cols, shape)  # [n, T] b
        if self.sched.flow:
            dt = (self.sched.coef - self.sched.coef_next)[steps.to(self.sched.coef.device)]  # [M] sigma_i - sigma_{i+1}
            weight = scatter(1.0 / dt.to(step.std.device), rows, cols, shape)             # [n, T] delta = 1 / dt
        std = scatter(step.std.reshape(-1).detach(), rows, cols, shape)                    # [n, T] s
        return Scores(log_probs=scatter(step.log_prob, rows, cols, shape), kl=kl, step_std=std, mean_drift=drift,
                      step_weight=weight)

    @contextlib.contextmanager
    def _reference(self):
        """The reference denoiser: the frozen copy, or the LoRA model with its adapter disabled (called
        through `self.model`, so a sharded wrapper still gathers its weights)."""
        if self.reference_model is not None:
            yield self.reference_model
            return
        self.denoiser.disable_adapters()
        try:
            yield self.model
        finally:
            self.denoiser.enable_adapters()

    @torch.no_grad()
    def reference_log_probs(self, rollout: Rollout, index: torch.Tensor) -> Reference:
        """The reference denoiser's SDE-step means on the trained transitions of samples `index`, as
        `Reference.state["mean"]` [n, T, ...] (zeros at padding), for the exact KL of `log_probs`; no
        reference log-probs (the core needs no estimate)."""
        if self.cfg.lora.rank == 0 and self.reference_model is None:
            raise ConfigError(NO_REFERENCE)
        rows, cols, x, x_next, steps, conds = transitions(rollout.state, rollout.mask, index)
        with self._autocast(), self._reference() as ref:
            step = rescore(self._denoiser(ref, self.sched), x, x_next, steps, conds, self.cfg.noise_level)
        mean = step.mean.new_zeros(index.numel(), rollout.mask.shape[1], *step.mean.shape[1:])  # [n, T, ...]
        mean[rows, cols] = step.mean
        return Reference(state={"mean": mean})

    def forward_process_loss(self, rollout: Rollout, index: torch.Tensor, r: torch.Tensor, spec) -> ForwardLoss:
        return nft.forward_process_loss(self, rollout, index, r, spec)

    def update_old(self, decay: float) -> None:
        self.nft_old.update(decay)

    def old_parameters(self) -> list[torch.Tensor]:
        """DiffusionNFT's sampling weights, in `trainable_parameters()`'s order (what rollout workers sample with)."""
        return list(self.nft_old.old)

    def trainable_parameters(self):
        return [p for p in self.denoiser.parameters() if p.requires_grad]

    # --- checkpoints -------------------------------------------------------------------------
    def save(self, path: str) -> None:
        if self.cfg.lora.rank > 0:
            save_lora(type(self.family.pipe), self.family.lora_prefix, self.denoiser, path)
        else:
            from safetensors.torch import save_file

            save_file({k: v.detach().cpu().contiguous() for k, v in self.denoiser.state_dict().items()}, path)
        if self.nft_old is not None:
            nft.save_old(self.nft_old, path)

    def load(self, path: str) -> None:
        if self.cfg.lora.rank > 0:
            load_lora(self.family.lora_prefix, self.denoiser, path)
        else:
            from safetensors.torch import load_file

            self.denoiser.load_state_dict(load_file(path, device=str(self.device)))
        if self.nft_old is not None:
            nft.load_old(self.nft_old, path)

    def extra_state(self) -> dict:
        """What a sharded checkpoint keeps besides the parameters (`mmrl.state.dcp`): DiffusionNFT's sampling copy."""
        if self.nft_old is None:
            return {}
        return {f"nft_old.{n}": o for n, o in zip(self.nft_old.names, self.nft_old.old)}

    @torch.no_grad()
    def load_extra_state(self, state: dict) -> None:
        for key, o in self.extra_state().items():
            if state[key] is not o:
                o.copy_(state[key])

    def export_lora(self, folder: str) -> str:
        """Write a diffusers LoRA folder loadable with `pipe.load_lora_weights(folder)`."""
        if self.cfg.lora.rank == 0:
            raise ValueError("export_lora needs a LoRA policy (policy.lora.rank > 0); full fine-tuning saves weights")
        return export_lora(type(self.family.pipe), self.family.lora_prefix, self.denoiser, folder)

    def export(self, folder: str) -> None:
        """The trained weights in diffusers' own folders: LoRA a LoRA folder (`pipe.load_lora_weights(folder)`),
        full fine-tuning the denoiser's `save_pretrained` folder (its class's `from_pretrained`). The
        DiffusionNFT old (sampling) copy is not exported."""
        if self.cfg.lora.rank > 0:
            self.export_lora(folder)
        else:
            self.denoiser.save_pretrained(folder)

    # --- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def generate_eval(self, prompts: PromptBatch) -> list:
        """One deterministic ODE image per prompt at `eval_steps` and `eval_guidance_scale` (None: the training
        scale), initial noise from the prompt seed."""
        texts = [self._prompt(r) for r in prompts.rows]
        conds = self.encode(texts)
        x = torch.cat([self.family.noise(1, torch.Generator(self.device).manual_seed(s)) for s in prompts.seeds])
        n, s = x.shape[0], len(self.eval_sched)
        ode = StepPlan(sde=torch.zeros(s, dtype=torch.bool), trained=torch.zeros(n, s, dtype=torch.bool))
        with self._autocast(), self._gathered():
            traj = denoise(self._denoiser(self.model, self.eval_sched, self.cfg.eval_guidance_scale), x,
                           [conds[t] for t in texts], ode, 0.0, None)
        images = self._decode(traj.final)
        return [self._sample(row, t, im, f"eval prompt {i}")
                for row, t, im, i in zip(prompts.rows, texts, images, prompts.index)]


validate_nft = nft.validate_nft   # algo.objective=nft: what this section needs (mmrl.config.policies calls it at load)


def _setup_training(policy: DiffusionPolicy, cfg: Config, name: str, kl_beta: float) -> None:
    den = policy.denoiser
    if cfg.lora.rank > 0:
        add_lora(den, cfg.lora, list(cfg.lora.target_modules) or families.lora_targets(name))
    else:  # full fine-tuning: fp32 master weights, frozen copy of the start as the KL reference (if any KL)
        if cfg.reference and kl_beta != 0:
            policy.reference_model = copy.deepcopy(den).requires_grad_(False).eval()
        den.float().requires_grad_(True)
    if cfg.gradient_checkpointing:
        den.enable_gradient_checkpointing()


def _check_sde(sched, cfg: Config, family: str) -> None:
    """A flow SDE step is x' ~ N(a x + b v, std^2) with a = 1 + dt g^2 / (2 sigma); a <= 0 flips and blows up the
    latent (flow_grpo's g = a sqrt(sigma / (1 - sigma)) at a first sigma just below 1, as Wan's UniPC sigmas start:
    1 - 1e-6). Such a schedule is refused before anything is sampled."""
    if not sched.flow or cfg.sde_schedule == "cps":
        return
    a = sched.coefs(cfg.noise_level).a                                        # [S]
    bad = (a <= 0).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        raise ConfigError(
            f"config keys 'policy.sde_schedule' / 'policy.noise_level': {cfg.sde_schedule} at noise level "
            f"{cfg.noise_level} gives step {i} (sigma {float(sched.coef[i]):.7f} -> {float(sched.coef_next[i]):.7f}) of "
            f"this {family} schedule a latent coefficient {float(a[i]):.4g} <= 0 (the SDE step diverges); use "
            "sde_schedule=linear (Flow-GRPO's Wan trainer), dance_grpo or cps, or a lower noise_level")


def build(cfg: Config, ctx) -> DiffusionPolicy:
    validate(cfg)
    if ctx.kl_beta != 0 and cfg.lora.rank == 0 and not cfg.reference:
        raise ConfigError(NO_REFERENCE)
    from diffusers.utils import logging as dlog

    dlog.disable_progress_bar()
    model = tiny.resolve(cfg.model)
    name = families.detect(model, cfg.revision) if cfg.family == "auto" else cfg.family
    opts = families.FamilyOptions(device=ctx.device, dtype=_dtype(ctx.precision, ctx.device), height=cfg.height,
                                  width=cfg.width, negative_prompt=cfg.negative_prompt,
                                  max_sequence_length=cfg.max_sequence_length, num_frames=cfg.num_frames, fps=cfg.fps,
                                  prediction_type=cfg.prediction_type,
                                  revision=cfg.revision, variant=cfg.variant)
    if cfg.num_frames and name not in families.VIDEO_FAMILIES:
        raise ConfigError(f"config key 'policy.num_frames' is for video families ({', '.join(families.VIDEO_FAMILIES)}); "
                          f"model {cfg.model!r} is of the image family {name!r}: remove it or set it to 0")
    family = families.load(name, model, opts)
    policy = DiffusionPolicy(cfg, family, ctx.accelerator)
    if ctx.step_reweight and not policy.sched.flow:
        raise ddim_reweight_error(f"model {cfg.model!r} (family {name!r})")
    if ctx.objective == "nft" and not policy.sched.flow:
        raise nft.ddim_error(f"model {cfg.model!r} (family {name!r})")
    _check_sde(policy.sched, cfg, name)
    policy.keep_means = ctx.ratio_norm
    policy.rollout_mode = getattr(ctx, "rollout", "gathered")
    _setup_training(policy, cfg, name, ctx.kl_beta)
    if policy.reference_model is not None and getattr(ctx, "shard", None) is not None:
        ctx.shard(policy.reference_model)                 # distributed.strategy=fsdp: a sharded frozen copy
    if ctx.objective == "nft":
        policy.nft_old = nft.OldPolicy(policy.denoiser)    # a copy of the start: old == theta at step 0
    return policy
