"""Checks of a loaded config, run by `load_config` before anything is built.

Every enumerated value is looked up in the registry that will serve it (so the valid names in a
message are exactly what the run could use), every numeric range is checked, and the policy,
reward and data-source references are resolved (imported, never called: no model, dataset or
reward is built here). Each failure is a `ConfigError` naming the key and what is valid.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from mmrl.errors import ConfigError

if TYPE_CHECKING:
    from mmrl.config import Config

PRECISIONS = ("fp32", "bf16", "fp16")


def one_of(key: str, value, valid) -> None:
    if value not in valid:
        raise ConfigError(f"config key '{key}' must be one of {', '.join(map(str, valid))}; got {value!r}")


def at_least(key: str, value, low, note: str = "") -> None:
    if value < low:
        raise ConfigError(f"config key '{key}' must be >= {low}{note}, got {value}")


def within(key: str, value, low, high, *, low_open=False, high_open=False) -> None:
    ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise ConfigError(f"config key '{key}' must be in {lo}{low}, {high}{hi}, got {value}")


def _registered(key: str, value: str, registry) -> None:
    try:
        registry.check(value, key)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_policy_loss(algo) -> None:
    """algo.policy_loss: a registered loss (its own check of the algo keys run here) or a user's function,
    imported now (never called) so that a missing file or name fails at load."""
    from mmrl.algorithms.policy_losses import resolve

    try:
        entry = resolve(algo.policy_loss)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if entry.check is not None:
        entry.check(algo)


def check_algo(cfg: Config) -> None:
    from mmrl.algorithms import credit, filtering
    from mmrl.algorithms.advantages import ESTIMATORS, REWARD_COMBINES
    from mmrl.algorithms.losses import AGGREGATIONS, KL_ESTIMATORS

    a, g = cfg.algo, cfg.train.group_size
    _registered("algo.advantage", a.advantage, ESTIMATORS)
    _registered("algo.aggregation", a.aggregation, AGGREGATIONS)
    filtering.check(a.filter)
    _registered("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS)
    check_policy_loss(a)
    _registered("algo.reward_combine", a.reward_combine, REWARD_COMBINES)
    within("algo.clip_low", a.clip_low, 0, 1, high_open=True)
    at_least("algo.clip_high", a.clip_high, 0)
    if a.adv_clip is not None and a.adv_clip <= 0:
        raise ConfigError(f"config key 'algo.adv_clip' must be > 0 or null, got {a.adv_clip}")
    at_least("algo.adv_eps", a.adv_eps, 0)
    at_least("algo.kl_beta", a.kl_beta, 0)
    if a.max_len_norm is not None:
        at_least("algo.max_len_norm", a.max_len_norm, 1)
    credit.check(a.credit, episodes=cfg.env is not None)
    if a.best_worst_k and not 1 <= a.best_worst_k <= g // 2:
        raise ConfigError(f"config key 'algo.best_worst_k' must be 0 (keep all) or between 1 and "
                          f"train.group_size/2 = {g // 2}, got {a.best_worst_k}")


def check_objective(cfg: Config) -> None:
    """algo.objective: a registered objective and its own check of the algo keys (`mmrl.algorithms.objectives`);
    the policy's support is checked with the policy section (`check_policy`)."""
    from mmrl.algorithms.objectives import OBJECTIVES

    _registered("algo.objective", cfg.algo.objective, OBJECTIVES)
    entry = OBJECTIVES.resolve(cfg.algo.objective)
    if entry.check is not None:
        entry.check(cfg.algo)


def check_optim(o, key: str) -> None:
    """An optim section (the run's, or a named policy's `policies.<name>.optim`)."""
    from mmrl.algorithms.schedules import SCHEDULES

    within(f"{key}.lr", o.lr, 0, float("inf"), low_open=True)
    at_least(f"{key}.weight_decay", o.weight_decay, 0)
    within(f"{key}.beta1", o.beta1, 0, 1, high_open=True)
    within(f"{key}.beta2", o.beta2, 0, 1, high_open=True)
    within(f"{key}.eps", o.eps, 0, float("inf"), low_open=True)
    at_least(f"{key}.warmup_steps", o.warmup_steps, 0)
    _registered(f"{key}.schedule", o.schedule, SCHEDULES)
    at_least(f"{key}.max_nonfinite_in_a_row", o.max_nonfinite_in_a_row, 1)


def check_sizes(cfg: Config) -> None:
    t = cfg.train
    for name in ("prompts_per_step", "update_epochs", "samples_per_microbatch"):
        at_least(f"train.{name}", getattr(t, name), 1)
    at_least("train.group_size", t.group_size, 2, " (group advantages compare the samples of a prompt)")
    at_least("train.grad_accum_steps", t.grad_accum_steps, 0, " (0 = the whole step in one optimizer step)")
    within("train.ema_decay", t.ema_decay, 0, 1, high_open=True)
    at_least("train.ema_every", t.ema_every, 1)
    at_least("max_steps", cfg.max_steps, 0)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)  # set by torchrun / accelerate launch
    if t.prompts_per_step % world:
        raise ConfigError(f"config key 'train.prompts_per_step' ({t.prompts_per_step}) must be divisible by "
                          f"the {world} processes")
    check_optim(cfg.optim, "optim")
    at_least("eval.every", cfg.eval.every, 0, " (0 = never)")
    at_least("eval.max_prompts", cfg.eval.max_prompts, 1)
    at_least("eval.prompts_per_batch", cfg.eval.prompts_per_batch, 1)
    at_least("checkpoint.every", cfg.checkpoint.every, 0, " (0 = only at the end)")
    at_least("checkpoint.keep_last", cfg.checkpoint.keep_last, 1)
    at_least("logging.save_samples_every", cfg.logging.save_samples_every, 0, " (0 = never)")
    for key, module, extra in (("tensorboard", "tensorboard", "tensorboard"), ("wandb", "wandb", "wandb")):
        if getattr(cfg.logging, key) and importlib.util.find_spec(module) is None:
            raise ConfigError(f"config key 'logging.{key}' is true but {module} is not installed: "
                              f"pip install 'mmrl[{extra}]', or set logging.{key}=false")


def check_run(cfg: Config) -> None:
    one_of("precision", cfg.precision, PRECISIONS)
    if not cfg.output_dir:
        raise ConfigError("config key 'output_dir' is empty: name the run directory")
    if os.path.exists(cfg.output_dir) and not os.path.isdir(cfg.output_dir):
        raise ConfigError(f"config key 'output_dir': {cfg.output_dir!r} is an existing file, not a directory; "
                          "name a new or existing run directory")
    if cfg.resume not in (None, "auto") and not os.path.isdir(cfg.resume):
        raise ConfigError(f"config key 'resume': checkpoint {cfg.resume!r} does not exist "
                          "(use resume=auto for the latest checkpoint of output_dir)")


def check_policy(cfg: Config) -> None:
    from mmrl.config.policies import validate_guard, validate_nft, validate_policy

    try:
        validate_policy(cfg.policy)
        validate_guard(cfg.policy, cfg.algo)
        validate_nft(cfg.policy, cfg.algo)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_rollout_correction(cfg: Config) -> None:
    from mmrl.algorithms import rollout_correction
    from mmrl.config.policies import validate_rollout_correction

    a = cfg.algo
    rollout_correction.check(a.rollout_correction)
    if a.rollout_correction.mode == "none":
        return
    try:
        validate_rollout_correction(cfg.policy, a)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def check_distributed(cfg: Config) -> None:
    d = cfg.distributed
    one_of("distributed.strategy", d.strategy, ("ddp", "fsdp"))
    one_of("distributed.rollout", d.rollout, ("gathered", "sharded"))
    if d.strategy == "fsdp" and d.rollout == "sharded" and cfg.env is not None:
        raise ConfigError("config key 'distributed.rollout' is sharded, but episodes (env section) take a different "
                          "number of turns on each process, which a per-block gather cannot pair up; use "
                          "distributed.rollout=gathered")


def check_rewards(cfg: Config) -> None:
    from rewards.registry import check
    from rewards.scorer import parse_specs

    if not cfg.rewards:
        raise ConfigError("config key 'rewards' is empty: list at least one reward, e.g. [{name: format}]")
    try:
        for key, entries in (("rewards", cfg.rewards), ("eval.diagnostics", cfg.eval.diagnostics)):
            for i, s in enumerate(parse_specs(list(entries), key)):
                check(s.name, s.kwargs, f"{key}[{i}].name", s.style)
    except ValueError as e:
        raise ConfigError(str(e)) from None


OBSERVATIONS = ("image", "text", "both")      # env.observation


def check_env(cfg: Config) -> None:
    """The `env:` section: ranges, the environment reference (resolved, not built), and that the policy
    runs episodes; episodes replace `data`."""
    from envs import check_env as check_reference
    from mmrl.config.policies import validate_episodes

    e = cfg.env
    if e is None:
        return
    at_least("env.max_turns", e.max_turns, 1)
    one_of("env.observation", e.observation, OBSERVATIONS)
    if e.history_turns is not None:
        at_least("env.history_turns", e.history_turns, 0, " (or null for all turns; 0 = the current observation only)")
    at_least("env.train_seeds", e.train_seeds, 1)
    if e.eval_seed_start < e.train_seeds:
        raise ConfigError(f"config key 'env.eval_seed_start' ({e.eval_seed_start}) must be >= env.train_seeds "
                          f"({e.train_seeds}): held-out episodes may not reuse training seeds")
    try:
        validate_episodes(cfg.policy, e)
        check_reference(e.name, e.kwargs, "env.name")
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if cfg.data.train or cfg.data.eval:
        raise ConfigError("config keys 'data.train' / 'data.eval' are not used with an env section: training "
                          "episodes come from seeds 0..env.train_seeds-1 and held-out ones from env.eval_seed_start; "
                          "remove the data section")


def check_roles(cfg: Config) -> None:
    """`policies:` and `env.roles` (mmrl/roles.py): the names and credit; each named policy's section checked by its
    adapter as the policy section is, with the same adapter, which must run multi-role episodes."""
    from mmrl import roles
    from mmrl.config.policies import adapter, validate_episodes, validate_guard, validate_nft, validate_policy

    roles.check(cfg)
    if cfg.env is None or not (cfg.env.roles or cfg.policies):
        return
    main = adapter(cfg.policy.name)
    if not hasattr(main, "build_team"):
        raise ConfigError(f"config key 'env.roles': policy {cfg.policy.name!r} does not run multi-role episodes (no "
                          "build_team); multi-role environments run with policy.name=vlm")
    for name, entry in cfg.policies.items():
        key = f"policies.{name}.policy"
        try:
            if adapter(entry.policy.name) is not main:
                raise ConfigError(f"config key '{key}.name': {entry.policy.name!r}; every policy of a multi-role "
                                  f"run is served by the policy section's adapter ({cfg.policy.name!r})")
            validate_policy(entry.policy)
            validate_guard(entry.policy, cfg.algo)
            validate_nft(entry.policy, cfg.algo)
            validate_episodes(entry.policy, cfg.env)
        except ConfigError:
            raise
        except ValueError as e:
            raise ConfigError(str(e).replace("'policy.", f"'{key}.")) from None
        check_optim(entry.optim, f"policies.{name}.optim")


def check_tools(cfg: Config) -> None:
    """The `tools:` list: each function imports and can be described to the model, its settings fit, the names
    are distinct, an MCP server's command exists (nothing is started); tools need episodes whose replies can see
    their results."""
    from tools import TOOL_FORMATS, check_tools as check_entries, parse_tools

    if not cfg.tools:
        return
    e = cfg.env
    if e is None:
        raise ConfigError("config key 'tools': tools are called in an environment's episodes; add an env section "
                          "(env.name=...) or remove the tools")
    at_least("env.max_tool_calls", e.max_tool_calls, 1)
    if e.history_turns == 0:
        raise ConfigError("config key 'env.history_turns' is 0 with tools: the model would never see a tool's "
                          "result (the next turn shows the current observation only); use 1 or more, or null")
    try:
        TOOL_FORMATS.check(e.tool_format, "env.tool_format")
        check_entries(parse_tools(list(cfg.tools)))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_data(cfg: Config) -> None:
    from mmrl.data import check_source

    d = cfg.data
    if cfg.env is not None:
        return                       # episodes (check_env)
    if not d.train:
        raise ConfigError("config key 'data.train' is empty: name a .jsonl/.json/.parquet file or 'module:function'")
    check_source(d.train, d.train_kwargs, "data.train")
    if d.eval:
        check_source(d.eval, d.eval_kwargs, "data.eval")
    elif cfg.eval.every > 0:
        raise ConfigError(f"config key 'eval.every' is {cfg.eval.every} but 'data.eval' is not set: name the "
                          "held-out prompts, or set eval.every=0")


def check_asynchronous(cfg: Config) -> None:
    from mmrl.config.asynchronous import check

    check(cfg)


def check_all(cfg: Config) -> None:
    """Everything that can be known from the config alone, cheapest first."""
    check_run(cfg)
    check_sizes(cfg)
    check_algo(cfg)
    check_objective(cfg)
    check_policy(cfg)
    check_rollout_correction(cfg)
    check_distributed(cfg)
    check_env(cfg)
    check_roles(cfg)
    check_tools(cfg)
    check_data(cfg)
    check_rewards(cfg)
    check_asynchronous(cfg)
