"""Policy (adapter) registry: `policy.name` -> the module that builds it.

Modules are named as strings and imported only when a config asks for them, so the core
never imports an adapter at module level. Each module defines a frozen dataclass
`Config` (its `policy:` section; a `name: str` field included) and
`build(cfg: Config, ctx: BuildContext) -> Policy`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from mmrl.registry import Registry

POLICIES: Registry = Registry("policy")
POLICIES.update({
    "bandit": "mmrl.bandit",          # test-only contextual bandit (proves the loop)
    "vlm": "vlm.policy",              # image-text-to-text models (vlm/)
    "diffusion": "diffusion.policy",  # diffusers text-to-image models (diffusion/)
})


@dataclass(frozen=True)
class BuildContext:
    """What an adapter may need from the run when it is built."""

    device: Any            # torch.device the trainer computes on
    seed: int
    output_dir: str
    precision: str         # fp32 | bf16 | fp16
    accelerator: Any = None
    kl_beta: float = 0.0   # algo.kl_beta: adapters skip building a reference when it is 0


def policy_module(name: str):
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; valid names: {', '.join(sorted(POLICIES))}")
    return importlib.import_module(POLICIES[name])


def policy_config_class(name: str) -> type:
    return policy_module(name).Config


def build_policy(cfg, ctx: BuildContext):
    return policy_module(cfg.name).build(cfg, ctx)
