"""An exponential moving average (EMA) of the trained weights (`train.ema_decay > 0`).

RL drifts toward outputs that exploit its reward; an average of the recent weights moves slower and is
a guard against that when the run is evaluated and exported. Flow-GRPO (arXiv:2505.05470) evaluates
and saves an EMA of its LoRA (`flow_grpo/ema.py`; decay 0.9, every 8 optimizer steps in its
`scripts/train_sd3.py`). Here the average covers `policy.trainable_parameters()` of any policy.

Notation (k counts the applied optimizer steps; a skipped non-finite step is not one):
    theta_k      the trained parameters after optimizer step k          `params`
    bar_theta_k  their average, fp32, on the parameters' device           `shadow`
    beta, K      `train.ema_decay`, `train.ema_every`
    beta_k       min(beta, (1 + k) / (10 + k)) with `train.ema_warmup`, else beta

    bar_theta_0 = theta_0;   at k = K, 2K, ...:   bar_theta_k = beta_k * bar_theta_{k-K} + (1 - beta_k) * theta_k

The cap (1 + k) / (10 + k) is Flow-GRPO's `get_current_decay` (diffusers' EMAModel caps its decay
with the same expression): the average leaves the initial weights quickly (beta_1 = 2/11) and
beta_k reaches beta = 0.9 at k = 80. Flow-GRPO averages when (k + 1) % K == 0, here when k % K == 0;
it calls its update once per sample batch, so with gradient accumulation over A batches it averages
the same weights in A times; here it is once per optimizer step.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mmrl.distributed.sharding import local


class EMA:
    """fp32 shadow copies of `params`; `update` after each applied optimizer step, `swapped_in`
    to run with the averaged weights, `save` / `load` for checkpoints."""

    def __init__(self, params, decay: float, every: int = 1, warmup: bool = True):
        assert 0.0 < decay < 1.0 and every >= 1, (decay, every)   # checked at load (train.ema_decay, ema_every)
        self.params = list(params)
        self.decay, self.every, self.warmup = decay, every, warmup
        self.shadow = [p.detach().float().clone() for p in self.params]   # bar_theta_0 = theta_0, fp32
        self.steps = 0                                                  # k

    def decay_at(self, k: int) -> float:
        """beta_k: the decay of the update at optimizer step k."""
        return min(self.decay, (1 + k) / (10 + k)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self) -> None:
        """Count one applied optimizer step; average the weights in when it is the K-th."""
        self.steps += 1
        if self.steps % self.every:
            return
        beta_k = self.decay_at(self.steps)
        for bar, p in zip(self.shadow, self.params):
            bar.lerp_(p.detach().float(), 1.0 - beta_k)                 # bar + (1 - beta_k) * (theta - bar)

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The averaged weights in the parameters for the block (cast to their dtype); the trained
        weights, kept on the CPU meanwhile, are put back bit for bit afterwards, also on an error."""
        kept = [local(p).detach().to("cpu", copy=True) for p in self.params]   # this process's shard under FSDP
        try:
            with torch.no_grad():
                for p, bar in zip(self.params, self.shadow):
                    p.copy_(bar)
            yield
        finally:
            with torch.no_grad():
                for p, theta in zip(self.params, kept):
                    local(p).copy_(theta)

    def save(self, path: str) -> None:
        tensors = {_key(i): bar.detach().cpu().contiguous() for i, bar in enumerate(self.shadow)}
        save_file(tensors, path, metadata={"steps": str(self.steps)})

    def load(self, path: str) -> None:
        """Restore `save`'s shadow and step count; a file of other shapes raises ValueError."""
        with safe_open(path, "pt") as f:
            steps = int((f.metadata() or {})["steps"])
            state = {k: f.get_tensor(k) for k in f.keys()}
        want = {_key(i): tuple(bar.shape) for i, bar in enumerate(self.shadow)}
        got = {k: tuple(v.shape) for k, v in state.items()}
        if got != want:
            diff = sorted(set(want.items()) ^ set(got.items()))[:3]
            raise ValueError(f"{path}: the averaged weights do not fit this policy's {len(want)} trainable tensors "
                             f"(first differences, name and shape: {diff})")
        for i, bar in enumerate(self.shadow):
            bar.copy_(state[_key(i)])
        self.steps = steps


def _key(i: int) -> str:
    return f"param_{i:05d}"      # the i-th of policy.trainable_parameters()


def build_ema(params, train) -> EMA | None:
    """The run's EMA from its `train` section; None when `train.ema_decay` is 0 (nothing is kept)."""
    if train.ema_decay == 0:
        return None
    return EMA(params, train.ema_decay, train.ema_every, train.ema_warmup)


def averaged_weights(ema: EMA | None):
    """A `with` block on the averaged weights; on the trained ones when there is no EMA."""
    return contextlib.nullcontext() if ema is None else ema.swapped_in()
