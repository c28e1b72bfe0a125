"""DiffusionNFT (Zheng et al., arXiv 2509.16117) on the diffusion policy: algo.objective=nft.

rollout:   the old (sampling) policy's images, by the policy's own sampler (SDE at noise_level, or the ODE
           with noise_level 0: any black-box sampler serves); only the clean latents x0 are kept, with
           each sample's seed, never a trajectory or a log-prob (`rollout_state`).
loss:      `forward_process_loss`: per sample, K distinct steps of the rollout schedule drawn without
           replacement and N(0, I) noise, both from a CPU generator seeded by the sample's seed and the
           update epoch; t = sigma of the step, x_t = (1 - t) x0 + t eps, v = eps - x0; v_old (no grad)
           and v_theta through the one `predict`, then `mmrl.algorithms.objectives.nft.nft_loss`.
CFG-free:  the loss uses the conditional velocity alone (guidance 1; flux keeps its guidance embedding,
           which is an input, not CFG); policy.guidance_scale only shapes the rollout and eval sampler,
           and the paper's recipe sets it to 1.
old:       `OldPolicy`, a copy of the trainable weights (the LoRA, or the whole denoiser when fully
           fine-tuned) swapped in place for the old forwards and the rollout, updated by `update`
           (old <- eta old + (1 - eta) theta) and saved next to the policy's checkpoint file.
Only flow-matching families (sd3, flux) have the velocity this loss needs; DDIM (sd) is a config error.
"""

from __future__ import annotations

import contextlib
import os

import torch

from diffusion.families import declared_ddim
from diffusion.families.common import predict
from mmrl.config import ConfigError
from mmrl.algorithms.objectives.nft import NFTSpec, nft_loss
from mmrl.types import ForwardLoss, Rollout

_MOD = 2**63 - 1


class OldPolicy:
    """The sampling policy's weights: one copy of each trainable parameter of the denoiser."""

    def __init__(self, denoiser: torch.nn.Module):
        named = [(n, p) for n, p in denoiser.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.old = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def _swap(self) -> None:
        for p, o in zip(self.params, self.old):                # one parameter's worth of extra memory at a time
            tmp = p.detach().clone()
            p.copy_(o)
            o.copy_(tmp)

    @contextlib.contextmanager
    def active(self):
        """The denoiser computes with the old weights inside (no grad); the trained weights come back exactly."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """old <- decay * old + (1 - decay) * theta (decay 0: old = theta exactly)."""
        for o, p in zip(self.old, self.params):
            o.copy_(decay * o + (1.0 - decay) * p.detach())

    def state_dict(self) -> dict:
        return {n: o.detach().cpu().contiguous() for n, o in zip(self.names, self.old)}

    @torch.no_grad()
    def load_state_dict(self, state: dict, where: str) -> None:
        if sorted(state) != sorted(self.names):
            extra, missing = sorted(set(state) - set(self.names)), sorted(set(self.names) - set(state))
            raise ValueError(f"{where} does not match the policy's trainable weights: unexpected {extra[:3]}, "
                             f"missing {missing[:3]}")
        for n, o in zip(self.names, self.old):
            if state[n].shape != o.shape:
                raise ValueError(f"{where}: {n} has shape {tuple(state[n].shape)}, the policy's {tuple(o.shape)}")
            o.copy_(state[n].to(o.device, o.dtype))


def old_path(policy_path: str) -> str:
    """Where the old weights are saved next to the policy's file: policy.safetensors -> policy.nft_old.safetensors."""
    return os.path.splitext(policy_path)[0] + ".nft_old.safetensors"


def save_old(old: OldPolicy, policy_path: str) -> None:
    from safetensors.torch import save_file

    save_file(old.state_dict(), old_path(policy_path))


def load_old(old: OldPolicy, policy_path: str) -> None:
    from safetensors.torch import load_file

    path = old_path(policy_path)
    if not os.path.isfile(path):
        raise ValueError(f"{path} is missing: a checkpoint of algo.objective=nft holds the old (sampling) policy "
                         "next to the policy's weights; this one was not written by an nft run")
    old.load_state_dict(load_file(path), path)


def sample_seeds(prompt_seeds: list[int], group_size: int) -> torch.Tensor:
    """[N] one seed per sample, from its prompt's seed and its place in the group."""
    return torch.tensor([(s * 1_000_003 + g) % _MOD for s in prompt_seeds for g in range(group_size)],
                        dtype=torch.long)


def rollout_state(x0: torch.Tensor, cond_rows: list, prompt_seeds: list[int], group_size: int) -> dict:
    """What the loss replays: the clean latents x0 [N, ...], each row's Cond and each sample's seed [N]."""
    return {"x0": x0, "cond": cond_rows, "seed": sample_seeds(prompt_seeds, group_size)}


def draw(seeds: torch.Tensor, epoch: int, num_steps: int, k: int, shape: tuple):
    """Per sample, K distinct steps of S [n, K] and noise [n, K, ...], from a CPU generator seeded by the
    sample's seed and the update epoch only (any process, any device: the same draws)."""
    steps, eps = [], []
    for seed in seeds.tolist():
        g = torch.Generator().manual_seed((seed * 7_919 + epoch) % _MOD)
        steps.append(torch.randperm(num_steps, generator=g)[:k])             # [K]
        eps.append(torch.randn((k, *shape), generator=g))                    # [K, ...]
    return torch.stack(steps), torch.stack(eps)


def _rows(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return t.view(-1, *[1] * (x.dim() - 1))                                   # [M, 1, ...]


def forward_process_loss(policy, rollout: Rollout, index: torch.Tensor, r: torch.Tensor, spec: NFTSpec) -> ForwardLoss:
    """DiffusionNFT's loss [n] of samples `index` (module docstring), the mean over each sample's K flow times."""
    sched, fam, dev = policy.sched, policy.family, policy.device
    s = len(sched)
    k = spec.timesteps or s
    x0 = rollout.state["x0"][index.to(rollout.state["x0"].device)].to(dev).float()  # [n, ...]
    n = x0.shape[0]
    steps, eps = draw(rollout.state["seed"][index.cpu()], spec.draw, s, k, tuple(x0.shape[1:]))  # [n, K], [n, K, ...]
    steps, eps = steps.reshape(-1).to(dev), eps.flatten(0, 1).to(dev)        # [M], [M, ...] with M = n K
    x0 = x0.repeat_interleave(k, 0)                                          # [M, ...]
    t = sched.coef[steps].float()                                            # [M] sigma of each step
    x_t = (1 - _rows(x0, t)) * x0 + _rows(x0, t) * eps                       # [M, ...]
    v_target = eps - x0                                                      # [M, ...] v
    conds = [rollout.state["cond"][i] for i in index.tolist() for _ in range(k)]
    guidance = 1.0 if fam.uses_cfg else policy.cfg.guidance_scale            # CFG-free (module docstring)
    chunk = policy.cfg.forward_batch

    def velocity(model):
        return predict(fam, model, x_t, steps, conds, sched, guidance, chunk)  # [M, ...]

    with torch.no_grad(), policy.nft_old.active():
        v_old = velocity(policy.model)                                       # [M, ...]
    v_theta = velocity(policy.model)                                         # [M, ...] with grad
    loss, metrics = nft_loss(v_theta, v_old, v_target, r.to(dev).float().repeat_interleave(k), t, spec.beta,
                             spec.adaptive_weight)                           # [M]
    kl = None
    if spec.kl:
        with torch.no_grad(), policy._reference() as ref:
            v_ref = velocity(ref)                                            # [M, ...]
        kl = (v_theta - v_ref).pow(2).flatten(1).mean(1).view(n, k).mean(1)  # [n] ||v_theta - v_ref||^2 / D
    return ForwardLoss(loss=loss.view(n, k).mean(1), kl=kl, metrics=metrics)


def ddim_error(what: str) -> ConfigError:
    return ConfigError(f"config key 'algo.objective': nft (DiffusionNFT) trains the velocity of a flow-matching "
                       f"model; {what} samples with DDIM; use an sd3 or flux model, or algo.objective=pg")


def validate_nft(cfg, algo) -> None:
    """What this policy section needs for algo.objective=nft (checked at load; the family once more at build)."""
    if declared_ddim(cfg.family, cfg.model):
        raise ddim_error(f"policy.family={cfg.family!r} (model {cfg.model!r})")
    if algo.nft.timesteps > cfg.rollout_steps:
        raise ConfigError(f"config key 'algo.nft.timesteps' must be <= policy.rollout_steps={cfg.rollout_steps} "
                          f"(distinct steps of the rollout schedule per sample; 0 = all), got {algo.nft.timesteps}")
