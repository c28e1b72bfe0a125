"""The denoising loop of a rollout, and the replay state it leaves behind.

`denoise` runs S steps from x_S (noise) to x_0, SDE on the plan's stochastic steps and ODE elsewhere,
and records only the latents that the trained steps need: for each sample, the input and output
of each trained step, deduplicated (a step's output is the next step's input). It scores those
transitions once, after the loop. `rescore` recomputes their log-probs (with grad) through the same
`predict`, step coefficients and `gaussian_log_prob`.

Notation: S rollout steps; T trained steps of a sample (a subset of the S); U stored latents per
sample (<= min(2T, S + 1)); B samples in the batch; M = number of valid (sample, trained step) pairs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from diffusion.families.common import CondBatch, Schedule, predict, sde_step
from diffusion.sde import SDEStep, StepCoefs, affine_mean, gaussian_log_prob
from diffusion.timesteps import StepPlan, trained_index


@dataclass(frozen=True)
class Trajectories:
    final: Tensor        # [B, ...] x_0, the latents to decode
    latents: Tensor      # [B, U, ...] the stored latents
    before: Tensor       # [B, T] slot in `latents` of each trained step's input
    after: Tensor        # [B, T] slot of its output
    step_index: Tensor   # [B, T] denoising step of each trained transition
    mask: Tensor         # [B, T] 1 for real transitions, 0 for padding
    log_probs: Tensor | None  # [B, T] log-prob of each trained transition at sampling time
    means: Tensor | None = None  # [B, T, ...] SDE-step mean of each trained transition (keep_means), zeros at padding
    step_versions: Tensor | None = None  # [S] int64 weights version of each denoising step (interruptible rollouts)


@dataclass(frozen=True)
class Denoiser:
    """How to call the model: everything `predict` needs besides the rows."""

    family: object
    model: object        # the (possibly accelerate-wrapped) denoiser, or the reference
    sched: Schedule
    guidance: float
    chunk: int           # rows per forward (common.predict)


def _draw(z: Tensor, generator: torch.Generator | list | None) -> Tensor:
    """Fill z [B, ...] fp32 with N(0, 1) in place (the values of torch.randn with that generator) and
    return it. A list of generators splits the rows evenly, each drawing its own block in order, so a
    prompt's noise never depends on which other prompts share the batch."""
    if not isinstance(generator, list):
        return z.normal_(generator=generator)
    rows = z.shape[0] // len(generator)
    for k, g in enumerate(generator):
        z[k * rows:(k + 1) * rows].normal_(generator=g)
    return z


def denoise(d: Denoiser, x: Tensor, conds: list, plan: StepPlan, noise_level: float,
            generator: torch.Generator | list | None, keep_means: bool = False, between=None) -> Trajectories:
    """Sample B trajectories from x [B, ...] (x_S), conditioned on `conds` (one Cond per row).
    `generator`: one generator, or a list of them each owning an equal consecutive block of rows.
    `keep_means`: also return each trained transition's SDE-step mean (GRPO-Guard's mu_old).
    `between`: interruptible rollouts (`mmrl.types.Interruptible`): called before each denoising step, it may
    load newer weights and returns the version loaded; the step runs with those weights, so its mean and
    log-prob are theirs, and `step_versions` records it.

    Each step is mean = a x + b out and x' = mean + std z with the step's coefficients as 0-dim tensors;
    the trained transitions are scored after the loop, all at once, by the `gaussian_log_prob` that
    `rescore` uses, from the same tensors (the on-policy ratio is exactly 1)."""
    b, s = x.shape[0], len(d.sched)
    need = torch.zeros(b, s + 1, dtype=torch.bool)                           # [B, S + 1] latents to keep
    need[:, :s] |= plan.trained
    need[:, 1:] |= plan.trained
    keep, sde, scored = need.any(0).tolist(), plan.sde.tolist(), plan.trained.any(0).tolist()  # no per-step checks
    steps = {True: d.sched.step_coefs(noise_level), False: d.sched.step_coefs(0.0)}
    conds = CondBatch(conds)                                                  # stacked once for all steps
    index = torch.arange(s, device=x.device)[:, None].expand(s, b)           # [S, B] step of each row
    z = torch.empty(x.shape, device=x.device, dtype=torch.float32)          # [B, ...] the noise, drawn per step
    kept, means = {}, {}                                                      # position / step -> [B, ...]
    versions = torch.zeros(s, dtype=torch.long)                              # [S]
    for i in range(s):
        if between is not None:                                               # a step boundary: newer weights?
            versions[i] = between()
        if keep[i]:
            kept[i] = x
        out = predict(d.family, d.model, x, index[i], conds, d.sched, d.guidance, d.chunk)  # [B, ...]
        c = steps[sde[i]][i]
        mean = affine_mean(c, x, out)                                         # [B, ...]
        _draw(z, generator)
        if scored[i]:
            means[i] = mean
        x = mean + c.std * z                                                  # [B, ...]
    if keep[s]:
        kept[s] = x
    traj = _pack(x, kept, need, plan.trained)
    mean = _stack_means(means, plan.trained, x)                               # [B, T, ...]
    logp = _score(traj, mean, d.sched.coefs(noise_level))                     # [B, T]
    return dataclasses.replace(traj, log_probs=logp, means=mean if keep_means else None,
                               step_versions=versions if between is not None else None)


def _stack_means(means: dict, trained: Tensor, final: Tensor) -> Tensor:
    """The step means of the trained transitions -> [B, T, ...] (zeros at padding)."""
    b, cols = final.shape[0], trained.long().cumsum(1) - 1                    # [B, S] column of step s in [B, T]
    if not means:
        return final.new_zeros(b, 0, *final.shape[1:])
    if bool((trained == trained[:1]).all()):                                  # same steps for all: one stack
        return torch.stack([means[i] for i in sorted(means)], 1)             # [B, T, ...]
    out = final.new_zeros(b, int(cols[:, -1].max()) + 1, *final.shape[1:])    # [B, T, ...]
    for i, m in means.items():
        who = torch.nonzero(trained[:, i]).squeeze(1)                         # [b']
        out[who.to(final.device), cols[who, i].to(final.device)] = m[who.to(final.device)]
    return out


def _score(traj: Trajectories, mean: Tensor, table: StepCoefs) -> Tensor:
    """[B, T] log-probs of the trained transitions (x' and the step means [B, T, ...]), 0 at padding;
    `table`: the [S] coefficients of the SDE steps (a trained step is always an SDE step)."""
    b, t = traj.mask.shape
    if t == 0:
        return traj.mask.float()
    rows = torch.arange(b, device=traj.latents.device)[:, None]              # [B, 1]
    x_next = traj.latents[rows, traj.after].flatten(0, 1)                    # [B T, ...]
    step = traj.step_index.flatten()                                          # [B T]
    rc = StepCoefs(0.0, 0.0, 0.0, table.inv2var[step], table.lconst[step])
    lp = gaussian_log_prob(x_next, mean.flatten(0, 1), rc).view(b, t)         # [B, T]
    return torch.where(traj.mask > 0, lp, 0.0)


def _pack(final: Tensor, kept: dict, need: Tensor, trained: Tensor) -> Trajectories:
    """Per sample, stack its needed latents into slots and map each trained step to its two slots
    (log_probs still to be scored)."""
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
    dev = final.device
    return Trajectories(final, latents, before.to(dev), after.to(dev), index.to(dev), mask.to(dev), None)


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
