"""A test-only policy: a contextual categorical bandit (after RAGEN's Bandit).

Each prompt is a context c; a sample is T arms a_1..a_T drawn independently from
softmax(theta[c, t]); the reward `mmrl.testing.bandit:match` is the fraction of positions whose
arm equals the context's target arm. Small enough to train in seconds, yet it drives the
real trainer end to end: rollout, rewards, advantages, clipped updates, KL, checkpoints.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import List

import torch
from safetensors.torch import load_file, save_file

from mmrl.distributed.sharding import gathered
from mmrl.errors import ConfigError
from mmrl.types import PromptBatch, Reference, Rollout, Scores
from rewards.sample import Sample


@dataclass(frozen=True)
class Config:
    name: str = "bandit"
    num_contexts: int = 4      # C
    num_arms: int = 8          # A
    num_actions: int = 1       # T, arms drawn per sample
    reference: bool = True     # keep a frozen copy of the initial logits for KL (only when algo.kl_beta != 0)
    nonfinite_steps: List[int] = field(default_factory=list)  # test hook: steps whose log-probs are NaN
    sleep_s: float = 0.0       # test hook: seconds to sleep per rollout (so a test can kill a run mid-way)


class Logits(torch.nn.Module):
    def __init__(self, c: int, t: int, a: int):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(c, t, a))      # [C, T, A] uniform start

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        return self.theta[context]                                 # [n, T, A]


class BanditPolicy:
    def __init__(self, cfg: Config, device, kl_beta: float = 0.0):
        self.cfg, self.device = cfg, device
        self.net = Logits(cfg.num_contexts, cfg.num_actions, cfg.num_arms).to(device)
        self.model = self.net                                      # the trainer may wrap it
        self.ref = self.net.theta.detach().clone() if cfg.reference and kl_beta != 0 else None
        self._poisoned = False

    def predict(self, context: torch.Tensor, actions: torch.Tensor):
        """The one forward used by rollout and re-scoring: (log-probs, entropy) [n, T]."""
        logp_all = torch.log_softmax(self.model(context).float(), dim=-1)    # [n, T, A]
        logp = logp_all.gather(-1, actions[..., None]).squeeze(-1)           # [n, T]
        entropy = -(logp_all.exp() * logp_all).sum(-1)                       # [n, T]
        if self._poisoned:
            logp = logp * float("nan")
        return logp, entropy

    @torch.no_grad()
    def rollout(self, prompts: PromptBatch, group_size: int) -> Rollout:
        self._poisoned = prompts.step in self.cfg.nonfinite_steps
        if self.cfg.sleep_s:
            time.sleep(self.cfg.sleep_s)
        contexts, actions, samples, groups = [], [], [], []
        with gathered(self.net):                                                     # FSDP: the whole table
            theta = self.net.theta.detach().clone()                                  # [C, T, A]
        for p, (row, seed) in enumerate(zip(prompts.rows, prompts.seeds)):
            gen = torch.Generator().manual_seed(seed)
            probs = torch.softmax(theta[row["context"]].float().cpu(), -1)           # [T, A]
            for g in range(group_size):
                arms = torch.multinomial(probs, 1, generator=gen).squeeze(-1)       # [T]
                contexts.append(row["context"])
                actions.append(arms)
                groups.append(p)
                samples.append(Sample(prompt=f"context {row['context']}", output=" ".join(map(str, arms.tolist())),
                                      answer=row["answer"], meta={"context": row["context"]},
                                      id=f"step {prompts.step} prompt {prompts.index[p]} sample {g}"))
        context = torch.tensor(contexts, device=self.device)                         # [N]
        acts = torch.stack(actions).to(self.device)                                  # [N, T]
        logp, _ = self.predict(context, acts)
        return Rollout(samples=samples, log_probs=logp, mask=torch.ones_like(logp),
                       group=torch.tensor(groups), state={"context": context, "actions": acts})

    def log_probs(self, rollout: Rollout, index: torch.Tensor, reference: Reference | None = None) -> Scores:
        """`reference` is not needed: the core estimates the KL from `Reference.log_probs`."""
        logp, entropy = self.predict(rollout.state["context"][index], rollout.state["actions"][index])
        return Scores(log_probs=logp, entropy=entropy)

    @torch.no_grad()
    def reference_log_probs(self, rollout: Rollout, index: torch.Tensor) -> Reference:
        if self.ref is None:
            raise ConfigError(_NO_REFERENCE)
        ctx, acts = rollout.state["context"][index], rollout.state["actions"][index]
        logp_all = torch.log_softmax(self.ref[ctx].float(), -1)                     # [n, T, A]
        return Reference(log_probs=logp_all.gather(-1, acts[..., None]).squeeze(-1))  # [n, T]

    def trainable_parameters(self):
        return [p for p in self.net.parameters() if p.requires_grad]

    def save(self, path: str) -> None:
        save_file({k: v.detach().cpu().contiguous() for k, v in self.net.state_dict().items()}, path)

    def load(self, path: str) -> None:
        self.net.load_state_dict(load_file(path, device=str(self.device)))

    @torch.no_grad()
    def generate_eval(self, prompts: PromptBatch) -> list:
        """Greedy arms for each prompt (evaluation)."""
        out = []
        with gathered(self.net):                                                     # FSDP: the whole table
            theta = self.net.theta.detach().clone()                                  # [C, T, A]
        for row, i in zip(prompts.rows, prompts.index):
            arms = theta[row["context"]].argmax(-1).tolist()
            out.append(Sample(prompt=f"context {row['context']}", output=" ".join(map(str, arms)),
                              answer=row["answer"], meta={"context": row["context"]}, id=f"eval prompt {i}"))
        return out


_NO_REFERENCE = "algo.kl_beta != 0 needs the bandit's reference logits: set policy.reference=true or algo.kl_beta=0"


def validate(cfg: Config) -> None:
    for name in ("num_contexts", "num_arms", "num_actions"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"config key 'policy.{name}' must be >= 1, got {getattr(cfg, name)}")


def build(cfg: Config, ctx) -> BanditPolicy:
    validate(cfg)
    if ctx.kl_beta != 0 and not cfg.reference:
        raise ConfigError(_NO_REFERENCE)
    return BanditPolicy(cfg, ctx.device, ctx.kl_beta)


def contexts(num_contexts: int = 4, num_arms: int = 8, num_actions: int = 1, seed: int = 0) -> list[dict]:
    """Dataset source: one record per context with its target arms (`data.train`)."""
    rng = random.Random(seed)
    return [{"context": c, "answer": " ".join(str(rng.randrange(num_arms)) for _ in range(num_actions))}
            for c in range(num_contexts)]


def match(samples: list) -> list:
    """Reward: fraction of positions whose arm equals the target arm."""
    out = []
    for s in samples:
        got, want = str(s.output).split(), str(s.answer).split()
        out.append(sum(a == b for a, b in zip(got, want)) / max(len(want), 1))
    return out
