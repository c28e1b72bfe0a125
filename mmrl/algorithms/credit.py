"""Credit assignment for multi-turn episodes (the `algo.credit` section): one advantage per trajectory, or per turn.

Notation: a group of G trajectories from one environment seed; trajectory i has turns k = 0..K_i-1 with
environment rewards r_{i,k} (an unparseable action at env.invalid_action_reward) and reply tokens in
consecutive action columns. A_i is the usual group advantage of the trajectory's combined reward
(`mmrl.algorithms.advantages`, e.g. the return under `env_return`).

- `trajectory` (StarPO, RAGEN arXiv 2504.20073): every token of trajectory i gets A_i.
- `turn_index`: discounted returns per turn R_{i,k} = sum_{k' >= k} gamma^(k'-k) r_{i,k'}, normalised
  among the group's turns with the same index k: A^S_{i,k} = (R_{i,k} - mean) / (std + eps) (unbiased
  std; 0 when fewer than two turns or no spread); tokens of turn k get A_i + w * A^S_{i,k}.
- `state` (GiGPO, verl-agent, arXiv 2505.10978): the same, but turns are grouped by the observation
  they answered (anchor states: equal observation keys, whatever the turn index), so a repeated state
  compares the actions taken from it.
w is `algo.credit.weight` (GiGPO's omega), gamma `algo.credit.gamma`. An unscorable trajectory (NaN
reward) gets 0 everywhere, as in the trajectory advantages, and takes no part in the turn statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from mmrl.episodes import EpisodeMeta
from mmrl.errors import ConfigError
from mmrl.registry import Registry

CREDITS: Registry = Registry("credit")


@dataclass(frozen=True)
class Credit:
    """A registered credit: `turn_key(meta, k)` -> the key whose turns are normalised together (None: trajectory
    level only, no turn-level term); `doc` is its line in the docs and listings."""

    turn_key: Callable | None
    doc: str = ""


CREDITS.register("trajectory")(Credit(None, "StarPO: the trajectory's advantage on every turn (no turn-level term)."))
CREDITS.register("turn_index")(Credit(lambda meta, k: k, "Adds a turn-level advantage: discounted returns "
                                      "normalised across the group's k-th turns."))
CREDITS.register("state")(Credit(lambda meta, k: meta[EpisodeMeta.STATES][k], "GiGPO: adds a turn-level advantage "
                                 "normalised across the group's turns taken from the same state (anchor states)."))


@dataclass(frozen=True)
class CreditConfig:
    """The `algo.credit` section (episodes)."""

    name: str = "trajectory"              # trajectory (StarPO) | turn_index | state (GiGPO)
    gamma: float = 1.0                    # discount of the per-turn returns (turn_index / state)
    weight: float = 1.0                   # weight of the turn-level advantage added to the trajectory's (GiGPO's omega)


def check(section: CreditConfig, episodes: bool) -> None:
    """Load-time checks of `algo.credit`; `episodes`: whether the run has an env section."""
    try:
        CREDITS.check(section.name, "algo.credit.name")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not 0 <= section.gamma <= 1:
        raise ConfigError(f"config key 'algo.credit.gamma' must be in [0, 1], got {section.gamma}")
    if section.weight < 0:
        raise ConfigError(f"config key 'algo.credit.weight' must be >= 0, got {section.weight}")
    if section.name != "trajectory" and not episodes:
        raise ConfigError(f"config key 'algo.credit.name' is {section.name!r}, a turn-level credit for multi-turn "
                          "episodes; it needs an env section (single-turn runs use algo.credit.name=trajectory)")


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """R_k = r_k + gamma * R_{k+1}, from the last turn back."""
    out, running = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + gamma * running
        out[k] = running
    return out


def normalised_within(values: list[float], keys: list, eps: float) -> list[float]:
    """GRPO's normalisation (`mmrl.algorithms.advantages.grpo`: unbiased std, 0 for a set of one or no spread) within
    each set of equal keys."""
    from mmrl.algorithms.advantages import grpo

    out = [0.0] * len(values)
    buckets: dict = {}
    for i, key in enumerate(keys):
        buckets.setdefault(key, []).append(i)
    for members in buckets.values():
        a = grpo(torch.tensor([[values[i] for i in members]]), eps=eps)[0]        # [m]
        for i, x in zip(members, a.tolist()):
            out[i] = x
    return out


def _step_advantages(metas: list[dict], valid: list[bool], turn_key: Callable, gamma: float,
                     eps: float) -> list[list[float]]:
    """A^S_{i,k} for the trajectories of one group; unscorable trajectories (not `valid`) take no part."""
    returns = [discounted_returns(m[EpisodeMeta.TURN_REWARDS], gamma) for m in metas]
    flat, keys, owner = [], [], []
    for i, (m, rets) in enumerate(zip(metas, returns)):
        if not valid[i]:
            continue
        for k, value in enumerate(rets):
            flat.append(value)
            keys.append(turn_key(m, k))
            owner.append(i)
    norm = normalised_within(flat, keys, eps)
    out = [[] for _ in metas]
    for i, a in zip(owner, norm):
        out[i].append(a)
    return out


def token_advantages(samples: list, adv: torch.Tensor, reward: torch.Tensor, group_size: int, width: int,
                     algo) -> torch.Tensor:
    """Advantages [N, width] of each action column under `algo.credit.name` (module docstring).
    adv: [N] the trajectory advantages A_i; reward: [N] the combined rewards (NaN = unscorable)."""
    n = len(samples)
    out = adv.float()[:, None].expand(n, width).clone()                        # [N, T] trajectory level
    credit = algo.credit
    turn_key = CREDITS.resolve(credit.name, "algo.credit.name").turn_key
    if turn_key is None:                                                       # trajectory level only
        return out
    for lo in range(0, n, group_size):
        metas = [s.meta for s in samples[lo:lo + group_size]]
        valid = [not bool(torch.isnan(reward[lo + i])) for i in range(len(metas))]
        steps = _step_advantages(metas, valid, turn_key, credit.gamma, algo.adv_eps)
        for i, (m, a_s) in enumerate(zip(metas, steps)):
            row, col = lo + i, 0
            for tokens, a in zip(m[EpisodeMeta.TURN_TOKENS], a_s):
                out[row, col:col + tokens] += credit.weight * a
                col += tokens
    return out
