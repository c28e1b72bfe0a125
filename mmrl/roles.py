"""Episodes of several roles (multi-agent): which policy plays each role, and how a role is credited.

An environment that defines `roles` (the contract in `envs`) is played by one policy per role. The config's
`env.roles` maps each role to a policy: `policy` (the `policy:` section) or a name from the top-level
`policies:` mapping, whose entries are a policy section of their own (another model, size or family; its own
LoRA) and an optional `optim:` override, so each named policy has its own optimizer, scheduler, checkpoint
files and metrics (`<name>/loss`, `<name>/reward/mean`, ...). Roles that name the same policy share it and its
updates; a role's `system_prompt` tells them apart (a shared policy with role prompts). Without `env.roles`
every role of a multi-role environment is played by `policy`.

Credit (MAGRPO, arXiv 2508.04652: group-relative advantages per agent over a joint return). Each role's
trajectory is a sample of the policy that plays it; the G episodes of one environment seed give each role a
group of G samples, and the usual group estimator (`algo.advantage`), filters and credit run on each policy's
samples per role group. What a role is credited with at each environment step is `env.role_credit`:

- `team`: the team's reward: a shared (float) reward, or the sum of the per-role rewards of a dict.
- `own`: a shared (float) reward, or the role's own entry of a dict (0 when it has none).

A role's return is the sum over the episode of what it was credited with at each step (the reward of a step
goes to the role's latest reply; `EpisodeMeta.TURN_REWARDS`), so `env_return` rewards it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

from mmrl.errors import ConfigError
from mmrl.registry import Registry

MAIN = "policy"                          # the name of the `policy:` section among the run's policies
NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")   # a named policy: a folder and a metric prefix


@dataclass(frozen=True)
class RoleConfig:
    """One entry of `env.roles`: `{role: policy_name}` or `{role: {policy: name, system_prompt: text}}`."""

    policy: str = MAIN                    # who plays the role: 'policy' (the policy section) or a key of `policies`
    system_prompt: Optional[str] = None   # the role's system prompt (None: the policy's policy.system_prompt)


ROLE_CREDITS: Registry = Registry("role credit")


@dataclass(frozen=True)
class RoleCredit:
    """A registered credit: `of(reward, role)` -> what `role` is credited with for one environment step's reward
    (a float shared by the team, or a dict role -> float); `doc` its line in the docs and listings."""

    of: Callable[[object, str], float]
    doc: str = ""


def _team(reward, role: str) -> float:
    return float(sum(reward.values())) if isinstance(reward, dict) else float(reward)


def _own(reward, role: str) -> float:
    return float(reward.get(role, 0.0)) if isinstance(reward, dict) else float(reward)


ROLE_CREDITS.register("team")(RoleCredit(_team, "Every role is credited with the team's reward: a shared reward, "
                                                "or the sum of the roles' rewards (MAGRPO's joint return)."))
ROLE_CREDITS.register("own")(RoleCredit(_own, "Every role is credited with its own reward (a shared reward goes "
                                              "to every role)."))


def credited(reward, role: str, credit: str) -> float:
    """What `role` is credited with for one step's `reward` under `env.role_credit`."""
    if isinstance(reward, dict):
        bad = {k: v for k, v in reward.items() if not isinstance(v, (int, float)) or isinstance(v, bool)}
        if bad:
            raise ValueError(f"a multi-role environment's step returned rewards {reward}; each must be a number "
                             "(a dict role -> float, or one float for the team)")
    elif not isinstance(reward, (int, float)) or isinstance(reward, bool):
        raise ValueError(f"a multi-role environment's step returned reward {reward!r}; expected a float (the "
                         "team's) or a dict role -> float")
    return ROLE_CREDITS.resolve(credit, "env.role_credit").of(reward, role)


def parse_roles(raw, key: str = "env.roles") -> dict[str, RoleConfig]:
    """The `env.roles` mapping (role -> policy name, or role -> {policy, system_prompt}) -> RoleConfigs."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config key '{key}' must map each role to the policy that plays it, e.g. "
                          f"{{speaker: policy, listener: listener}}; got {raw!r}")
    out = {}
    for role, entry in raw.items():
        if isinstance(entry, str):
            entry = {"policy": entry}
        if not isinstance(entry, dict):
            raise ConfigError(f"config key '{key}.{role}' must be a policy name or {{policy: name, system_prompt: "
                              f"text}}; got {entry!r}")
        unknown = sorted(set(entry) - {"policy", "system_prompt"})
        if unknown:
            raise ConfigError(f"unknown config key '{key}.{role}.{unknown[0]}'. Valid keys in {key}.{role}: policy, "
                              "system_prompt")
        policy, prompt = entry.get("policy", MAIN), entry.get("system_prompt")
        if not isinstance(policy, str) or (prompt is not None and not isinstance(prompt, str)):
            raise ConfigError(f"config key '{key}.{role}': policy must be a name and system_prompt a text; got "
                              f"{entry!r}")
        out[str(role)] = RoleConfig(policy, prompt)
    return out


def check(cfg) -> None:
    """Load-time checks of `policies:`, `env.roles` and `env.role_credit` (the environment is not built: that its
    roles are these is checked when the run starts, `roles_of`)."""
    named = dict(cfg.policies)
    for name in named:
        if not NAME.match(name) or name == MAIN:
            raise ConfigError(f"config key 'policies.{name}': a policy name is lowercase letters, digits and _ "
                              f"(at most 32, starting with a letter) and not {MAIN!r} (the policy section's own name)")
    env = cfg.env
    if env is None:
        if named:
            raise ConfigError("config key 'policies': named policies play roles of a multi-role environment; add an "
                              "env section with env.roles, or remove the policies")
        return
    try:
        ROLE_CREDITS.check(env.role_credit, "env.role_credit")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    valid = [MAIN] + list(named)
    for role, r in env.roles.items():
        if r.policy not in valid:
            raise ConfigError(f"config key 'env.roles.{role}.policy': {r.policy!r} is not a policy of this run; "
                              f"valid: {', '.join(valid)} (named policies are keys of the top-level 'policies')")
    played = {r.policy for r in env.roles.values()} | ({MAIN} if not env.roles else set())
    idle = [n for n in valid if n not in played]
    if idle:
        raise ConfigError(f"config key 'policies.{idle[0]}' plays no role: every policy, the policy section "
                          "included, must play a role in env.roles (or remove it)")
    if env.roles or named:
        unsupported(cfg)


def unsupported(cfg) -> None:
    """What multi-role episodes do not run with yet (a ConfigError naming the key), checked at load when the config
    names roles and again when the run finds that its environment has roles."""
    a = cfg.asynchronous
    if a.enabled and a.interrupt:
        raise ConfigError("config key 'asynchronous.interrupt': a joint episode's replies are not interrupted for "
                          "newer weights yet (each policy would change mid-episode); set asynchronous.interrupt=false")
    if a.enabled and a.reward_workers:
        raise ConfigError("config key 'asynchronous.reward_workers': a joint episode's samples are scored by the "
                          "rollout worker that played it; set asynchronous.reward_workers=0")
    if cfg.policies and cfg.distributed.strategy != "ddp":
        raise ConfigError("config key 'distributed.strategy': several named policies train with ddp only for now "
                          f"(got {cfg.distributed.strategy}); set distributed.strategy=ddp")
    if cfg.policies and cfg.train.ema_decay > 0:
        raise ConfigError("config key 'train.ema_decay': an EMA of the weights is kept for one policy only; with "
                          "named policies set train.ema_decay=0")


def run_roles(cfg) -> dict[str, RoleConfig] | None:
    """The role -> RoleConfig mapping when the run's environment has roles (the environment built once to ask;
    before any model), else None."""
    if cfg.env is None:
        return None
    from envs import make_env

    env = make_env(cfg.env.name, dict(cfg.env.kwargs))
    try:
        return roles_of(cfg, env)
    finally:
        env.close()


def roles_of(cfg, env) -> dict[str, RoleConfig] | None:
    """The role -> RoleConfig mapping of a run whose environment is `env` (built once when the run starts);
    None when the environment has no roles (one policy, one trajectory per episode). A config whose roles are not
    the environment's is a ConfigError."""
    roles = getattr(env, "roles", None) or getattr(getattr(env, "unwrapped", None), "roles", None)
    given = cfg.env.roles
    if not roles:
        if given:
            raise ConfigError(f"config key 'env.roles' names roles {sorted(given)}, but environment {cfg.env.name!r} "
                              "has none (a multi-role environment defines `roles`; see envs)")
        return None
    roles = tuple(str(r) for r in roles)
    if len(set(roles)) != len(roles):
        raise ConfigError(f"environment {cfg.env.name!r}: its roles {list(roles)} must be distinct")
    if given and set(given) != set(roles):
        raise ConfigError(f"config key 'env.roles' names roles {sorted(given)}, but environment {cfg.env.name!r} "
                          f"has roles {list(roles)}: map each of them to a policy")
    unsupported(cfg)
    return {r: given.get(r, RoleConfig()) for r in roles}


def policies_of(roles: dict[str, RoleConfig]) -> list[str]:
    """The run's policies in the order they first play a role ('policy' first when it plays one)."""
    order = [MAIN] if any(r.policy == MAIN for r in roles.values()) else []
    for r in roles.values():
        if r.policy not in order:
            order.append(r.policy)
    return order
