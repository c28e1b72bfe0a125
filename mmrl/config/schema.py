"""Typed run configuration: frozen dataclasses, a YAML file, dotted `key=value` overrides.

Every field is documented once, here. Unknown keys and wrong types are errors that name
the key and list the valid ones. The `policy` section is validated against the `Config`
dataclass of the adapter named by `policy.name` (see `mmrl.config.policies`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from mmrl.algorithms.credit import CreditConfig
from mmrl.algorithms.filtering import FilterConfig
from mmrl.algorithms.objectives.decoupled import DecoupledConfig
from mmrl.algorithms.objectives.nft import NFTConfig
from mmrl.algorithms.rollout_correction import RolloutCorrectionConfig
from mmrl.config.asynchronous import AsyncConfig
from mmrl.roles import parse_roles
from mmrl.errors import ConfigError  # noqa: F401  (re-exported: `from mmrl.config import ConfigError` keeps working)


@dataclass(frozen=True)
class DataConfig:
    train: str = ""                       # .jsonl / .json / .parquet file, or 'module:function' returning records
    train_kwargs: Dict[str, Any] = field(default_factory=dict)  # keyword arguments of a 'module:function' source
    eval: Optional[str] = None            # held-out prompts, same forms as `train`; None = no evaluation
    eval_kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    prompts_per_step: int = 8             # prompts per step across all processes (P)
    group_size: int = 8                   # samples per prompt (G); N = P * G samples per step
    update_epochs: int = 1                # passes over each step's samples
    samples_per_microbatch: int = 8       # samples in one forward/backward
    grad_accum_steps: int = 0             # microbatches per optimizer step; 0 = the whole step's batch
    ema_decay: float = 0.0                # EMA of the trained weights for eval and policy_ema.safetensors (mmrl/loop/ema.py); 0 = off, else in (0, 1)
    ema_every: int = 1                    # average the weights in every K applied optimizer steps
    ema_warmup: bool = True               # cap the decay at (1 + k) / (10 + k) at optimizer step k (Flow-GRPO)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0            # clip the global grad norm; <= 0 disables clipping
    warmup_steps: int = 0                 # linear warm-up, in optimizer steps
    schedule: str = "constant"            # constant | linear | cosine (decay over the run's optimizer steps)
    max_nonfinite_in_a_row: int = 3       # NaN/inf loss or grads: skip the step; stop after this many in a row


@dataclass(frozen=True)
class AlgoConfig:
    advantage: str = "grpo"               # grpo | dr_grpo | rloo | reinforce_pp | grpo_batch_std
    adv_eps: float = 1e-6                 # added to the std in the denominator
    adv_clip: Optional[float] = None      # clamp advantages to [-c, c] (Flow-GRPO uses 5)
    reward_combine: str = "reward_sum"    # reward_sum (weighted sum, one advantage) | advantage_sum (per reward)
    policy_loss: str = "ppo_clip"         # ppo_clip | dual_clip | gspo | grpo_guard | cispo, or 'module:fn' / 'path/to/file.py:fn' (mmrl/algorithms/policy_losses/)
    clip_low: float = 0.2                 # eps_low of the ratio clip (cispo: of the importance weight)
    clip_high: float = 0.2                # eps_high (DAPO clip-higher: 0.28)
    dual_clip: Optional[float] = None     # policy_loss dual_clip: the constant c of min(l, -c A) for A < 0; None = 3
    aggregation: str = "token-mean"       # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
    max_len_norm: Optional[int] = None    # constant of seq-mean-token-sum-norm; None = T of the batch
    kl_beta: float = 0.0                  # KL coefficient; 0 runs no reference forward at all (nft: times the velocity distance ||v_theta - v_ref||^2 / D)
    kl_estimator: str = "k3"              # k1 | k2 | k3 (ignored where the adapter computes an exact KL)
    entropy_coef: float = 0.0             # entropy bonus (needs an adapter that computes entropies)
    filter: FilterConfig = field(default_factory=FilterConfig)   # name (none | dynamic | starpo), keep_frac, max_resample_rounds: mmrl/algorithms/filtering.py
    best_worst_k: int = 0                 # keep the k best and k worst samples of each group (2k of G; DanceGRPO); 0 = all
    credit: CreditConfig = field(default_factory=CreditConfig)   # episodes: name (trajectory | turn_index | state), gamma, weight: mmrl/algorithms/credit.py
    step_reweight: bool = False           # GRPO-Guard gradient reweighting: each step's surrogate times 1/dt (flow-matching diffusion only)
    objective: str = "pg"                 # pg (policy gradient over per-action log-probs) | decoupled (AReaL's decoupled PPO for stale samples) | nft (DiffusionNFT's forward-process loss; diffusion only): mmrl/algorithms/objectives
    nft: NFTConfig = field(default_factory=NFTConfig)  # objective nft: beta, adv_scale, adaptive_weight, timesteps, old_decay_*: mmrl/algorithms/objectives/nft.py
    decoupled: DecoupledConfig = field(default_factory=DecoupledConfig)  # objective decoupled: mode, max, min of pi_prox / pi_behav: mmrl/algorithms/objectives/decoupled.py
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)  # mode, max, min: mmrl/algorithms/rollout_correction.py


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0                        # evaluate every K steps (0 = never); also at step 0 and the end when > 0
    max_prompts: int = 64                 # held-out prompts used per evaluation
    prompts_per_batch: int = 16
    diagnostics: List[Any] = field(default_factory=list)  # reward entries scored on held-out outputs only, never trained on: eval/quality/<label>


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 0                        # save every K steps (0 = only at the end)
    keep_last: int = 2                    # complete checkpoints kept on disk


@dataclass(frozen=True)
class LoggingConfig:
    progress: bool = True                 # live reward and held-out reward: a bar on a terminal, else a plain line every ~10% of the run
    tensorboard: bool = False             # needs the `tensorboard` extra
    wandb: bool = False                   # needs the `wandb` extra
    wandb_project: str = "mmrl"
    save_samples_every: int = 0           # write samples/step_<step>.jsonl every K steps (0 = never)


@dataclass(frozen=True)
class DistributedConfig:
    strategy: str = "ddp"                 # ddp (a full copy per process) | fsdp (FSDP2: weights, gradients, optimizer states sharded per block; mmrl/distributed/sharding.py)
    rollout: str = "gathered"             # fsdp: gathered (the whole model all-gathered once per rollout, generation runs without collectives) | sharded (each block gathered per forward; ranks in lockstep)
    reshard_after_forward: bool = True    # fsdp: free a block's gathered weights after its forward (ZeRO-3); false keeps them to the backward (fewer all-gathers, more memory)


@dataclass(frozen=True)
class EnvConfig:
    """The `env:` section (multi-turn agents; `mmrl.episodes`). Keys not listed here are the
    environment's own keyword arguments (`kwargs`), e.g. `env: {name: frozenlake, size: 4}`."""

    name: str = ""                        # registered environment (bandit | frozenlake | sokoban), gym:<id>, or module:attr / file.py:attr
    max_turns: int = 5                    # model replies per episode; an episode still running then ends as truncated
    observation: str = "both"             # what the model is shown of each observation: image | text | both
    history_turns: Optional[int] = None   # earlier turns kept in the prompt: None = all (one forward per trajectory); K = the last K (0 = the current observation only)
    invalid_action_reward: float = -0.1   # reward of a reply whose action does not parse (the episode goes on; RAGEN's format penalty)
    instructions: Optional[str] = None    # task text shown at the start; None = the environment's `instructions`
    train_seeds: int = 100_000            # training episodes use environment seeds 0 .. train_seeds-1
    eval_seed_start: int = 1_000_000      # held-out episodes use seeds eval_seed_start .. + eval.max_prompts - 1 (disjoint)
    max_tool_calls: int = 8               # with `tools`: tool calls an episode may make; later calls are answered with an error (kind limit)
    tool_format: str = "hermes"           # with `tools`: how replies write calls and templates without tools announce them (tools/formats.py)
    roles: Dict[str, Any] = field(default_factory=dict)  # a multi-role environment: role -> the policy playing it ('policy' or a key of `policies`), or {policy, system_prompt}; empty = `policy` plays every role (mmrl/roles.py)
    role_credit: str = "team"             # multi-role: what a role is credited with: team (the team's reward) | own (its own reward): mmrl/roles.py
    kwargs: Dict[str, Any] = field(default_factory=dict)  # the environment's keyword arguments (the section's other keys)


@dataclass(frozen=True)
class Config:
    output_dir: str = "runs/default"      # run directory: config.yaml, metrics.jsonl, checkpoints/, samples/
    seed: int = 0
    max_steps: int = 100                  # training steps (one rollout and its updates each)
    resume: Optional[str] = None          # None | auto (latest complete checkpoint in output_dir) | a checkpoint path
    precision: str = "fp32"               # fp32 | bf16 | fp16 (autocast on GPU; step math stays fp32)
    cpu: bool = False                     # force CPU even where a GPU is present
    policy: Any = None                    # the adapter's section: `name` plus its own fields
    rewards: List[Any] = field(default_factory=list)  # [{name, weight, label, timeout_s, max_fail_frac, **kwargs}]
    env: Any = None                       # EnvConfig: episodes of an environment instead of `data` prompts (multi-turn agents)
    policies: Dict[str, Any] = field(default_factory=dict)  # named policies playing roles of a multi-role env: {name: {policy: {name: vlm, ...}, optim: {...overrides}}} (mmrl/roles.py)
    tools: List[Any] = field(default_factory=list)  # tools the agent may call in its episodes: [{name, label, timeout_s, max_chars, **settings}] (tools/box.py)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    asynchronous: AsyncConfig = field(default_factory=AsyncConfig)  # rollout workers on Ray beside the learner: mmrl/config/asynchronous.py


def _schema_at(schema: type, dotted: str) -> tuple[str, list[str]]:
    """The section path and valid keys of the dataclass that holds `dotted`."""
    cls, path = schema, []
    for part in dotted.split(".")[:-1]:
        f = {f.name: f for f in dataclasses.fields(cls)}.get(part)
        sub = f.default_factory if f else None
        if not (isinstance(sub, type) and dataclasses.is_dataclass(sub)):
            break
        cls, path = sub, path + [part]
    return ".".join(path) or "top level", [f.name for f in dataclasses.fields(cls)]


def _explain(err: OmegaConfBaseException, schema: type, prefix: str = "") -> ConfigError:
    key = prefix + (getattr(err, "full_key", None) or "")
    first = str(err).splitlines()[0]
    if isinstance(err, ConfigKeyError):
        where, keys = _schema_at(schema, getattr(err, "full_key", "") or "")
        return ConfigError(f"unknown config key '{key}'. Valid keys in {prefix + where if prefix else where}: "
                           f"{', '.join(keys)}")
    if isinstance(err, ValidationError):
        return ConfigError(f"config key '{key}' has the wrong type: {first}")
    return ConfigError(f"invalid config{f' at {key!r}' if key else ''}: {first}")


def _merge(schema: type, *layers, prefix: str = ""):
    try:
        return OmegaConf.merge(OmegaConf.structured(schema), *layers)
    except OmegaConfBaseException as e:
        raise _explain(e, schema, prefix) from None


def _read_yaml(path: str):
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        node = OmegaConf.load(path)
    except Exception as e:  # yaml errors carry line numbers
        raise ConfigError(f"cannot parse config file {path!r}: {e}") from None
    if not OmegaConf.is_dict(node):
        raise ConfigError(f"config file {path!r} must hold a mapping of sections, got {type(node).__name__}")
    return node


def _parse_overrides(overrides: list[str]):
    for o in overrides:
        if "=" not in o or o.startswith("="):
            raise ConfigError(f"override {o!r} must look like key=value (dotted keys, e.g. optim.lr=1e-5)")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot parse overrides {overrides}: {e}") from None


# Keys that were renamed: old dotted key -> (new key, why). Using an old key is an error naming the new one.
RENAMED = {
    "algo.best_of_n": ("algo.best_worst_k", "it keeps the k best and k worst samples of a group, 2k in all"),
}


# flat algo keys that became keys of an algorithm's section (the section's fields live in its module)
MOVED = {
    **{f"algo.nft_{k}": f"algo.nft.{k}" for k in ("beta", "adv_scale", "adaptive_weight", "timesteps",
                                                  "old_decay_rate", "old_decay_max", "old_decay_delay")},
    "algo.rollout_correction_max": "algo.rollout_correction.max",
    "algo.rollout_correction_min": "algo.rollout_correction.min",
    "algo.filter_keep_frac": "algo.filter.keep_frac",
    "algo.max_resample_rounds": "algo.filter.max_resample_rounds",
    "algo.turn_gamma": "algo.credit.gamma",
    "algo.turn_weight": "algo.credit.weight",
}
# keys that held a name and are now sections: the name moved into the section
SECTIONS = {"algo.filter": "algo.filter.name", "algo.credit": "algo.credit.name",
            "algo.rollout_correction": "algo.rollout_correction.mode"}
# flags of the clipped surrogate that became policy losses of their own: key -> (the value that chose the loss,
# the loss); the flag's other value is every other loss's behaviour
BECAME_LOSSES = {"algo.ratio_level": ("sequence", "gspo"), "algo.ratio_norm": (True, "grpo_guard")}


def _check_renamed(layers) -> None:
    for old, (new, why) in RENAMED.items():
        for layer in layers:
            if OmegaConf.select(layer, old, default=_ABSENT) is not _ABSENT:
                raise ConfigError(f"config key '{old}' was renamed to '{new}' ({why}); use {new}")
    for layer in layers:
        for old, new in MOVED.items():
            if OmegaConf.select(layer, old, default=_ABSENT) is not _ABSENT:
                raise ConfigError(f"config key '{old}' moved into its algorithm's section: use '{new}'")
        for key, new in SECTIONS.items():
            value = OmegaConf.select(layer, key, default=_ABSENT)
            if value is not _ABSENT and not OmegaConf.is_dict(value):
                raise ConfigError(f"config key '{key}' is a section now; its value {value!r} goes to '{new}' "
                                  f"({new}={value})")
        for key, (on, loss) in BECAME_LOSSES.items():
            if OmegaConf.select(layer, key, default=_ABSENT) is not _ABSENT:
                raise ConfigError(f"config key '{key}' is gone: its {on!r} is the policy loss {loss!r} now, "
                                  f"algo.policy_loss={loss} (remove '{key}'; the other value is the default)")


def migrate(raw: dict) -> dict:
    """A run's saved config (a plain dict) written before the algorithm sections were nested -> today's keys;
    what resume and export read from a run directory (a user's own config gets the errors above instead)."""
    algo = dict(raw.get("algo") or {})
    for old, new in MOVED.items():
        name = old.removeprefix("algo.")
        if name in algo:
            section, key = new.removeprefix("algo.").split(".")
            algo.setdefault(section, {})
            if not isinstance(algo[section], dict):
                algo[section] = {SECTIONS[f"algo.{section}"].rsplit(".", 1)[1]: algo[section]}
            algo[section][key] = algo.pop(name)
    for key, new in SECTIONS.items():
        name = key.removeprefix("algo.")
        if name in algo and not isinstance(algo[name], dict):
            algo[name] = {new.rsplit(".", 1)[1]: algo[name]}
    for key, (on, loss) in BECAME_LOSSES.items():
        if algo.pop(key.removeprefix("algo."), None) == on:
            algo["policy_loss"] = _became(algo.get("policy_loss", "ppo_clip"), loss)
    if algo.get("dual_clip") is not None and algo.get("policy_loss", "ppo_clip") == "ppo_clip":
        algo["policy_loss"] = "dual_clip"             # the flag of ppo_clip then, a loss of its own now
    return {**raw, "algo": algo} if "algo" in raw else raw


def _became(old: str, new: str) -> str:
    if old not in ("ppo_clip", new):
        raise ConfigError(f"this run's saved config combines algo.policy_loss={old} with a flag that is the policy "
                          f"loss {new!r} now; the two cannot both be resumed: start a new run")
    return new


_ABSENT = object()
ENV_KEYS = tuple(f.name for f in dataclasses.fields(EnvConfig) if f.name != "kwargs")


def _env_section(raw) -> "EnvConfig | None":
    """The `env:` mapping -> EnvConfig: its own keys typed and checked, every other key an argument
    of the environment (`kwargs`)."""
    if raw is None:
        return None
    if not OmegaConf.is_dict(raw) or "name" not in raw:
        raise ConfigError("config section 'env' must be a mapping with a 'name' (e.g. env.name=frozenlake)")
    plain = OmegaConf.to_container(raw, resolve=True)
    nested = plain.pop("kwargs", None) or {}       # the form config.yaml is written in
    if not isinstance(nested, dict):
        raise ConfigError(f"config key 'env.kwargs' must be a mapping of the environment's arguments, got {nested!r}")
    both = sorted(set(nested) & set(plain))
    if both:
        raise ConfigError(f"config keys {', '.join(f'env.{k}' for k in both)} are given both directly and under env.kwargs")
    own = {k: v for k, v in plain.items() if k in ENV_KEYS}
    roles = parse_roles(own.pop("roles", None))
    node = _merge(EnvConfig, OmegaConf.create(own), prefix="env.")
    try:
        env = OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        raise _explain(e, EnvConfig, "env.") from None
    return dataclasses.replace(env, roles=roles,
                               kwargs={**nested, **{k: v for k, v in plain.items() if k not in ENV_KEYS}})


@dataclass(frozen=True)
class NamedPolicy:
    """An entry of the top-level `policies:` mapping (mmrl/roles.py): a policy section of its own and its
    optimizer (the top-level `optim` with this entry's overrides)."""

    policy: Any = None                    # the adapter's section, as `policy:` (name plus its own fields)
    optim: OptimConfig = field(default_factory=OptimConfig)


def _policy_section(raw, key: str):
    """A policy section (a mapping with `name`) -> the adapter's frozen Config, typed and checked by its dataclass."""
    from mmrl.config.policies import policy_config_class

    if raw is None or not OmegaConf.is_dict(raw) or "name" not in raw:
        raise ConfigError(f"config section '{key}' must be a mapping with a 'name' (e.g. {key}.name=vlm)")
    try:
        cls = policy_config_class(str(raw.name))
    except ValueError as e:  # the registry's message names the key and the valid names
        raise ConfigError(str(e).replace("'policy.name'", f"'{key}.name'")) from None
    node = _merge(cls, raw, prefix=f"{key}.")
    try:
        return OmegaConf.to_object(node)
    except OmegaConfBaseException as e:
        raise _explain(e, cls, f"{key}.") from None


def _policies_section(raw, optim_node) -> dict:
    """The `policies:` mapping -> {name: NamedPolicy}: each entry's policy section checked by its adapter's
    dataclass, its optim the run's `optim` with the entry's overrides."""
    if raw is None:
        return {}
    if not OmegaConf.is_dict(raw):
        raise ConfigError("config section 'policies' must map names to {policy: {name: ...}, optim: {...}}")
    out = {}
    for name in raw:
        entry = raw[name]
        if not OmegaConf.is_dict(entry) or "policy" not in entry:
            raise ConfigError(f"config section 'policies.{name}' must be a mapping with a 'policy' section (and an "
                              "optional 'optim'), e.g. {policy: {name: vlm, model: ...}, optim: {lr: 1e-4}}")
        unknown = sorted(set(entry) - {"policy", "optim"})
        if unknown:
            raise ConfigError(f"unknown config key 'policies.{name}.{unknown[0]}'. Valid keys in policies.{name}: "
                              "policy, optim")
        policy = _policy_section(entry.policy, f"policies.{name}.policy")
        layers = [optim_node] + ([entry.optim] if entry.get("optim") is not None else [])
        optim = OmegaConf.to_object(_merge(OptimConfig, *layers, prefix=f"policies.{name}.optim."))
        out[str(name)] = NamedPolicy(policy, optim)
    return out


def load_config(path: str | None, overrides: list[str] = (), *, saved: bool = False) -> Config:
    """YAML file + `key=value` overrides -> a frozen `Config`, checked in full (`mmrl.config.checks`)
    before anything is built. `saved`: the file is a run's own config.yaml, which may predate today's keys
    (`migrate`)."""
    from mmrl.config.checks import check_all

    file_layer = _read_yaml(path) if path else None
    if saved and file_layer is not None:
        file_layer = OmegaConf.create(migrate(OmegaConf.to_container(file_layer)))
    layers = ([file_layer] if file_layer is not None else []) + [_parse_overrides(list(overrides))]
    _check_renamed(layers)
    merged = _merge(Config, *layers)
    policy_raw = merged.policy
    if policy_raw is None or not OmegaConf.is_dict(policy_raw) or "name" not in policy_raw:
        raise ConfigError("config section 'policy' must be a mapping with a 'name' (e.g. policy.name=bandit)")
    policy = _policy_section(policy_raw, "policy")
    env = _env_section(merged.env)
    policies = _policies_section(merged.policies, merged.optim)
    OmegaConf.set_readonly(merged, False)
    merged.policy = None
    merged.env = None
    merged.policies = {}
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise _explain(e, Config) from None
    cfg = dataclasses.replace(cfg, policy=policy, env=env, policies=policies)
    check_all(cfg)
    return cfg


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def describe_sections() -> str:
    """Text for `mmrl train --help`: every section with its keys and defaults."""
    lines = []
    defaults = Config()
    for f in dataclasses.fields(Config):
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(f"  {f.name}: {_keys(value)}")
        else:
            lines.append(f"  {f.name} (default {value!r})")
    lines.append("valid names (from the registries):")
    lines += [f"  {key}: {registry.valid()}" for key, registry in _registries().items()]
    return "\n".join(lines)


def _keys(section) -> str:
    """`key=default, ...` of a section, a nested section as `name.{key=default, ...}`."""
    parts = []
    for g in dataclasses.fields(section):
        value = getattr(section, g.name)
        parts.append(f"{g.name}.{{{_keys(value)}}}" if dataclasses.is_dataclass(value) else f"{g.name}={value!r}")
    return ", ".join(parts)


def _registries() -> dict:
    """Config key -> the registry that serves it (imported here: the registries' modules import this one)."""
    from mmrl.algorithms.advantages import ESTIMATORS, REWARD_COMBINES
    from mmrl.algorithms.credit import CREDITS
    from mmrl.algorithms.filtering import FILTERS
    from mmrl.algorithms.losses import AGGREGATIONS, KL_ESTIMATORS
    from mmrl.algorithms.objectives import OBJECTIVES
    from mmrl.algorithms.policy_losses import POLICY_LOSSES
    from mmrl.algorithms.rollout_correction import CORRECTIONS
    from mmrl.algorithms.schedules import SCHEDULES
    from mmrl.config.asynchronous import PLACEMENTS, STALENESS
    from mmrl.distributed.weight_sync import WEIGHT_SYNC
    from mmrl.roles import ROLE_CREDITS
    from tools import TOOL_FORMATS, TOOLS

    return {"asynchronous.on_stale": STALENESS, "asynchronous.weight_sync": WEIGHT_SYNC,
            "asynchronous.learner_placement": PLACEMENTS, "algo.objective": OBJECTIVES, "algo.advantage": ESTIMATORS, "algo.reward_combine": REWARD_COMBINES,
            "algo.policy_loss": POLICY_LOSSES, "algo.aggregation": AGGREGATIONS, "algo.kl_estimator": KL_ESTIMATORS,
            "algo.filter.name": FILTERS, "optim.schedule": SCHEDULES, "algo.credit.name": CREDITS, "algo.rollout_correction.mode": CORRECTIONS,
            "tools[].name": TOOLS, "env.tool_format": TOOL_FORMATS, "env.role_credit": ROLE_CREDITS}
