"""The parts of a run that both the trainer and an asynchronous rollout worker build from the config: the
adapter's policy, the reward sets, the training and held-out records."""

from __future__ import annotations

import functools

from accelerate import Accelerator

from mmrl import episodes
from mmrl.config import Config, ConfigError
from mmrl.config.policies import BuildContext, build_policy, needs_ratio_norm
from mmrl.data import load_records
from mmrl.distributed import sharding
from mmrl.types import Shardable


def run_records(cfg: Config) -> tuple[list, list | None]:
    """Training and held-out records: the data sources, or the environment's episode seeds."""
    if cfg.env is not None:
        held_out = episodes.eval_records(cfg.env, cfg.eval.max_prompts) if cfg.eval.every > 0 else None
        return episodes.train_records(cfg.env), held_out
    records = load_records(cfg.data.train, cfg.data.train_kwargs, "data.train")
    eval_records = (load_records(cfg.data.eval, cfg.data.eval_kwargs, "data.eval")
                    if cfg.data.eval and cfg.eval.every > 0 else None)
    return records, eval_records


def build_policy_for_run(cfg: Config, acc: Accelerator, *, shard: bool = True):
    """The adapter's policy; with distributed.strategy=fsdp (and `shard`) its model sharded in place (its
    parameters become DTensors, `mmrl.distributed.sharding`), after which `policy.on_shard()` takes the new
    parameters where it holds any. A rollout worker (`mmrl.loop.asynchronous.worker`) builds a whole copy."""
    dist_cfg = cfg.distributed
    shard = (functools.partial(sharding.shard, device=acc.device, precision=cfg.precision,
                               reshard_after_forward=dist_cfg.reshard_after_forward)
             if dist_cfg.strategy == "fsdp" and shard else None)
    algo = cfg.algo
    ctx = BuildContext(device=acc.device, seed=cfg.seed, output_dir=cfg.output_dir, precision=cfg.precision,
                       accelerator=acc, kl_beta=algo.kl_beta, env=cfg.env, tools=tuple(cfg.tools), ratio_norm=needs_ratio_norm(algo),
                       step_reweight=algo.step_reweight, objective=algo.objective, shard=shard,
                       rollout=dist_cfg.rollout)
    try:
        policy = build_policy(cfg.policy, ctx)
    except ConfigError:
        raise
    except (ValueError, OSError) as e:  # a model that cannot be found or does not fit the section
        raise ConfigError(f"building policy {cfg.policy.name!r}: {e}") from None
    if shard is not None:
        shard(policy.model)
        if isinstance(policy, Shardable):
            policy.on_shard()
    return policy


def build_rewards(cfg: Config):
    """The trained reward set and the held-out diagnostics (None without `eval.diagnostics`)."""
    from rewards.scorer import RewardSet, parse_specs

    try:
        rewards = RewardSet(parse_specs(list(cfg.rewards)))
        diagnostics = (RewardSet(parse_specs(list(cfg.eval.diagnostics), "eval.diagnostics"))
                       if cfg.eval.diagnostics else None)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return rewards, diagnostics
