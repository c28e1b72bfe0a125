"""Policy (adapter) registry: `policy.name` -> the adapter that builds it.

An adapter is a module (or any object) with
    Config                      a frozen dataclass: its `policy:` section, a `name: str` field included
    build(cfg, ctx) -> Policy   builds the policy (loads models); `ctx` is a `BuildContext`
    validate(cfg)               optional: pure checks of the section (no model loaded), raising
                                ValueError naming the key; run when the config is loaded
    validate_episodes(cfg, env) present when the adapter runs environment episodes (`env:` section):
                                checks that the policy section can run them, raising ValueError
    validate_guard(cfg, algo)   present when the adapter's actions are Gaussian steps that can serve
                                GRPO-Guard (algo.policy_loss=grpo_guard / algo.step_reweight, `mmrl.algorithms.guard`):
                                checks that this policy section can, raising ValueError
    validate_nft(cfg, algo)     present when the policy implements the forward-process loss of
                                algo.objective=nft (DiffusionNFT, `mmrl.algorithms.objectives.nft`):
                                checks that this policy section can serve it, raising ValueError
    validate_rollout_correction(cfg, algo)  present when the policy can sample with an engine other than
                                its trained forward and record that engine's log-probs
                                (`Rollout.engine_log_probs`, algo.rollout_correction): checks that this
                                section does, raising ValueError
`policy.name` is a registered name (below; imported only when a config asks for it, so the core
never imports an adapter at module level) or a reference 'package.module:attr' /
'path/to/file.py:attr' to a third-party adapter, which needs no edit of mmrl.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mmrl.registry import LookupFailed, Registry

POLICIES: Registry = Registry("policy", references=True)
POLICIES.update({
    "bandit": "mmrl.testing.bandit",          # test-only contextual bandit (proves the loop)
    "vlm": "vlm.policy",              # image-text-to-text models (vlm/)
    "diffusion": "diffusion.policy",  # diffusers text-to-image models (diffusion/)
})


@dataclass(frozen=True, kw_only=True)
class BuildContext:
    """What an adapter may need from the run when it is built (keyword arguments only)."""

    device: Any            # torch.device the trainer computes on
    seed: int
    output_dir: str
    precision: str         # fp32 | bf16 | fp16
    accelerator: Any = None
    kl_beta: float = 0.0   # algo.kl_beta: adapters build no reference when it is 0
    env: Any = None        # the `env:` section (mmrl.config.EnvConfig) of a multi-turn agent run, else None
    tools: Any = ()        # the `tools:` list of an agent run (entries as in the config; the adapter builds them)
    ratio_norm: bool = False  # the policy loss reads RatioNorm's terms (grpo_guard): record what Scores.mean_drift needs
    step_reweight: bool = False  # algo.step_reweight: the adapter must supply Scores.step_weight
    objective: str = "pg"  # algo.objective: nft builds what Policy.forward_process_loss needs (mmrl.algorithms.objectives.nft)
    shard: Any = None      # distributed.strategy=fsdp: shard(module) shards a model the policy builds besides
                           # `model` (a frozen reference, a sampling copy) like the trainer shards `model`; else None
    rollout: str = "gathered"  # distributed.rollout: how sampling code gathers sharded weights (mmrl.distributed.sharding.gathered)


def adapter(name: str):
    """The adapter named by `policy.name`, checked to have `Config` and `build`."""
    obj = POLICIES.resolve(name, "policy.name")
    missing = [a for a in ("Config", "build") if not hasattr(obj, a)]
    if missing:
        raise LookupFailed(f"config key 'policy.name': {name!r} is not an adapter (it has no "
                           f"{' and no '.join(missing)}); an adapter defines a `Config` dataclass and "
                           "`build(cfg, ctx)`")
    return obj


def policy_config_class(name: str) -> type:
    return adapter(name).Config


def validate_policy(cfg) -> None:
    """The adapter's own checks of its section, if it has any."""
    check = getattr(adapter(cfg.name), "validate", None)
    if check is not None:
        check(cfg)


def validate_episodes(cfg, env) -> None:
    """Whether the adapter of `cfg` can run the episodes of the `env:` section (ValueError if not)."""
    check = getattr(adapter(cfg.name), "validate_episodes", None)
    if check is None:
        raise ValueError(f"config section 'env': policy {cfg.name!r} does not run environment episodes "
                         "(multi-turn agents run with policy.name=vlm); remove the env section")
    check(cfg, env)


def validate_guard(cfg, algo) -> None:
    """Whether the adapter of `cfg` can serve GRPO-Guard: a policy loss that reads RatioNorm's terms
    (algo.policy_loss=grpo_guard) or algo.step_reweight (ValueError if not)."""
    uses = []
    if needs_ratio_norm(algo):
        uses.append(("algo.policy_loss", f"{algo.policy_loss}", "algo.policy_loss=ppo_clip"))
    if algo.step_reweight:
        uses.append(("algo.step_reweight", "true", "algo.step_reweight=false"))
    if not uses:
        return
    check = getattr(adapter(cfg.name), "validate_guard", None)
    if check is None:
        key, value, off = uses[0]
        raise ValueError(f"config key '{key}' ({value}): GRPO-Guard needs actions that are Gaussian denoising "
                         f"steps (policy.name=diffusion); policy {cfg.name!r} has none; set {off}")
    check(cfg, algo)


def needs_ratio_norm(algo) -> bool:
    """Whether algo.policy_loss reads GRPO-Guard's RatioNorm terms (the rollout must record its step means)."""
    from mmrl.algorithms.policy_losses import resolve

    return resolve(algo.policy_loss).ratio_norm


def validate_nft(cfg, algo) -> None:
    """Whether the adapter of `cfg` can serve algo.objective=nft (ValueError if not)."""
    if algo.objective != "nft":
        return
    check = getattr(adapter(cfg.name), "validate_nft", None)
    if check is None:
        raise ValueError(f"config key 'algo.objective': nft (DiffusionNFT) trains a flow-matching model on its clean "
                         f"samples (policy.name=diffusion); policy {cfg.name!r} has no forward-process loss; set "
                         "algo.objective=pg")
    check(cfg, algo)


def validate_rollout_correction(cfg, algo) -> None:
    """Whether the policy of `cfg` samples with an engine that reports its own log-probs (ValueError if not),
    which algo.rollout_correction needs (`Rollout.engine_log_probs`)."""
    check = getattr(adapter(cfg.name), "validate_rollout_correction", None)
    if check is None:
        raise ValueError(f"config key 'algo.rollout_correction.mode': policy {cfg.name!r} samples with the forward "
                         "it trains, so there is no engine mismatch to correct; set algo.rollout_correction.mode=none")
    check(cfg, algo)


def build_policy(cfg, ctx: BuildContext):
    from mmrl.types import check_policy

    policy = adapter(cfg.name).build(cfg, ctx)
    check_policy(policy, cfg.name)                # the required members (capabilities: mmrl.types.check_capabilities)
    return policy
