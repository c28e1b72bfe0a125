"""The denoising loop of a rollout, and the replay state it leaves behind.

`denoise` runs S steps from x_S (noise) to x_0, SDE on the plan's stochastic steps and ODE elsewhere,
and records only the latents that the trained steps need: for each sample, the input and output
of each trained step, deduplicated (a step's output is the next step's input). `rescore` recomputes
the log-probs of those stored transitions (with grad) through the same `predict` and `sde_step`.

Notation: S rollout steps; T trained steps of a sample (a subset of the S); U stored latents per
sample (<= min(2T, S + 1)); B samples in the batch; M = number of valid (sample, trained step) pairs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from diffusion.families.common import Schedule, predict, sde_step
from diffusion.sde import SDEStep
from diffusion.timesteps import StepPlan, trained_index


@dataclass(frozen=True)
class Trajectories:
    final: Tensor        # [B, ...] x_0, the latents to decode
    latents: Tensor      # [B, U, ...] the stored latents
    before: Tensor       # [B, T] slot in `latents` of each trained step's input
    after: Tensor        # [B, T] slot of its output
    step_index: Tensor   # [B, T] denoising step of each trained transition
    mask: Tensor         # [B, T] 1 for real transitions, 0 for padding
    log_probs: Tensor    # [B, T] log-prob of each trained transition at sampling time
    means: Tensor | None = None  # [B, T, ...] SDE-step mean of each trained transition (keep_means), zeros at padding


@dataclass(frozen=True)
class Denoiser:
    """How to call the model: everything `predict` needs besides the rows."""

    family: object
    model: object        # the (possibly accelerate-wrapped) denoiser, or the reference
    sched: Schedule
    guidance: float
    chunk: int           # rows per forward (common.predict)


def _noise(generators: list, x: Tensor) -> Tensor:
    """z [B, ...]: the rows split evenly over `generators`, each drawing its own block in order, so a
    prompt's noise never depends on which other prompts share the batch."""
    rows = x.shape[0] // len(generators)
    return torch.cat([torch.randn((rows, *x.shape[1:]), generator=g, device=x.device, dtype=torch.float32)
                      for g in generators])                                   # [B, ...]


def denoise(d: Denoiser, x: Tensor, conds: list, plan: StepPlan, noise_level: float,
            generator: torch.Generator | list | None, keep_means: bool = False) -> Trajectories:
    """Sample B trajectories from x [B, ...] (x_S), conditioned on `conds` (one Cond per row).
    `generator`: one generator, or a list of them each owning an equal consecutive block of rows.
    `keep_means`: also record each trained transition's SDE-step mean (GRPO-Guard's mu_old)."""
    gens = generator if isinstance(generator, list) else None
    b, s = x.shape[0], len(d.sched)
    need = torch.zeros(b, s + 1, dtype=torch.bool)                           # [B, S + 1] latents to keep
    need[:, :s] |= plan.trained
    need[:, 1:] |= plan.trained
    keep, sde = need.any(0).tolist(), plan.sde.tolist()                     # python bools: no per-step checks
    kept, logp = {}, []                                                       # position -> [B, ...]; S x [B]
    col = plan.trained.long().cumsum(1) - 1                                   # [B, S] column of step s in [B, T]
    means = x.new_zeros(b, int(col[:, -1].max()) + 1 if s else 0, *x.shape[1:]) if keep_means else None  # [B, T, ...]
    for i in range(s):
        if keep[i]:
            kept[i] = x
        index = torch.full((b,), i, dtype=torch.long, device=x.device)       # [B]
        out = predict(d.family, d.model, x, index, conds, d.sched, d.guidance, d.chunk)  # [B, ...]
        z = _noise(gens, x) if gens is not None else None
        step = sde_step(d.sched, out, x, index, noise_level if sde[i] else 0.0,
                        generator=None if gens else generator, variance_noise=z)
        logp.append(step.log_prob)
        if means is not None and plan.trained[:, i].any():
            who = torch.nonzero(plan.trained[:, i]).squeeze(1)                # [b']
            means[who.to(x.device), col[who, i].to(x.device)] = step.mean[who.to(x.device)]
        x = step.prev_sample
    if keep[s]:
        kept[s] = x
    return dataclasses.replace(_pack(x, kept, need, plan.trained, torch.stack(logp, 1).cpu()), means=means)  # logp [B, S]


def _pack(final: Tensor, kept: dict, need: Tensor, trained: Tensor, logp: Tensor) -> Trajectories:
    """Per sample, stack its needed latents into slots and map each trained step to its two slots."""
    b = final.shape[0]
    index, mask = trained_index(trained)                                      # [B, T], [B, T]
    slot = torch.where(need, need.long().cumsum(1) - 1, -1)                   # [B, S + 1] position -> slot
    if bool((need == need[:1]).all()) and kept:                               # same positions for all: one copy
        latents = torch.stack([kept[pos] for pos in sorted(kept)], 1)        # [B, U, ...]
    else:
        u = int(need.sum(1).max()) if need.any() else 0
        latents = final.new_zeros(b, u, *final.shape[1:])                     # [B, U, ...]
        for pos, x in kept.items():                                           # one copy per position, all samples
            who = torch.nonzero(need[:, pos]).squeeze(1)                      # [b']
            latents[who.to(final.device), slot[who, pos].to(final.device)] = x[who.to(x.device)]
    rows = torch.arange(b)[:, None]                                           # [B, 1]
    before = torch.where(mask > 0, slot[rows, index], 0)                      # [B, T]
    after = torch.where(mask > 0, slot[rows, index + 1], 0)                   # [B, T]
    old = torch.where(mask > 0, logp.gather(1, index), 0.0)                   # [B, T]
    dev = final.device
    return Trajectories(final, latents, before.to(dev), after.to(dev), index.to(dev), mask.to(dev), old.to(dev))


def transitions(state: dict, mask: Tensor, idx: Tensor):
    """The valid transitions of samples `idx`: (rows, cols) [M] into [n, T], x and x' [M, ...], steps [M]."""
    dev = state["latents"].device
    idx = idx.to(dev)
    lat = state["latents"][idx]                                               # [n, U, ...]
    rows, cols = torch.nonzero(mask[idx.to(mask.device)].to(dev) > 0, as_tuple=True)  # [M], [M]
    x = lat[rows, state["before"][idx][rows, cols]]                           # [M, ...]
    x_next = lat[rows, state["after"][idx][rows, cols]]                       # [M, ...]
    steps = state["step_index"][idx][rows, cols]                              # [M]
    conds = [state["cond"][i] for i in idx[rows].tolist()]
    return rows, cols, x, x_next, steps, conds


def rescore(d: Denoiser, x: Tensor, x_next: Tensor, steps: Tensor, conds: list, noise_level: float) -> SDEStep:
    """Score the stored transitions x -> x_next [M, ...] at steps [M] (with grad if enabled)."""
    out = predict(d.family, d.model, x, steps, conds, d.sched, d.guidance, d.chunk)  # [M, ...]
    return sde_step(d.sched, out, x, steps, noise_level, prev_sample=x_next)


def scatter(values: Tensor, rows: Tensor, cols: Tensor, shape: tuple) -> Tensor:
    """[M] values -> [n, T] with zeros at padding (differentiable)."""
    return torch.zeros(shape, dtype=values.dtype, device=values.device).index_put((rows, cols), values)
