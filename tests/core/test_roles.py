"""Multi-role runs at the config boundary (mmrl/roles.py): what each role is credited with (a hand table), the
`policies:` and `env.roles` sections checked at load with errors that name the key, and the roles of a run checked
against its environment's."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from mmrl.config import ConfigError, load_config, to_yaml
from mmrl.roles import RoleConfig, credited, policies_of, roles_of
from tests import REPO

TEAM = os.path.join(REPO, "configs", "tiny", "team_tiny.yaml")


# (reward of one step, role, credit) -> what the role is credited with
@pytest.mark.parametrize("reward, role, credit, want", [
    (1.0, "speaker", "team", 1.0),                                    # a shared reward: every role gets it
    (1.0, "speaker", "own", 1.0),
    ({"first": 1.0, "second": 0.5}, "first", "team", 1.5),           # team: the sum of the roles' rewards
    ({"first": 1.0, "second": 0.5}, "second", "team", 1.5),
    ({"first": 1.0, "second": 0.5}, "first", "own", 1.0),            # own: the role's entry
    ({"first": 1.0, "second": 0.5}, "second", "own", 0.5),
    ({"first": 1.0}, "second", "own", 0.0),                          # no entry: 0
    ({"first": -2.0, "second": 0.5}, "second", "team", -1.5),
    (0, "first", "team", 0.0),
])
def test_credit_table(reward, role, credit, want):
    assert credited(reward, role, credit) == want


@pytest.mark.parametrize("reward", ["1", None, {"first": "1"}, {"first": True}])
def test_rewards_that_are_not_numbers_are_errors(reward):
    with pytest.raises(ValueError, match="multi-role environment"):
        credited(reward, "first", "team")


def test_team_config_loads_and_round_trips(tmp_path):
    cfg = load_config(TEAM)
    assert cfg.env.roles == {"speaker": RoleConfig("policy"), "listener": RoleConfig("listener")}
    listener = cfg.policies["listener"]
    assert listener.policy.model == "tiny:llava" and listener.policy.lora.rank == 0
    assert listener.optim.lr == 1e-4 and listener.optim.max_grad_norm == cfg.optim.max_grad_norm == 1.0
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(cfg))
    assert load_config(str(saved), saved=True) == cfg
    assert policies_of(cfg.env.roles) == ["policy", "listener"]
    short = load_config(TEAM, ["env.roles.speaker.policy=listener", "env.roles.listener.policy=policy",
                               "env.roles.speaker.system_prompt=You speak."])
    assert short.env.roles["speaker"] == RoleConfig("listener", "You speak.")
    assert policies_of(short.env.roles) == ["policy", "listener"]


@pytest.mark.parametrize("overrides, match", [
    (["env.roles.listener=teacher"], r"env\.roles\.listener\.policy.*'teacher'.*valid: policy, listener"),
    (["env.roles.listener=policy"], r"policies\.listener' plays no role"),
    (["env.roles.speaker=listener"], r"policies\.policy' plays no role|'policy' plays no role"),
    (["env.role_credit=mine"], r"env\.role_credit.*mine.*own, team"),
    (["policies.listener.policy.lr=1"], r"policies\.listener\.policy\.lr"),
    (["policies.listener.policy.name=diffusion"], r"policies\.listener\.policy"),
    (["policies.listener.optim.lr=0"], r"policies\.listener\.optim\.lr"),
    (["policies.listener.optim.schedule=wavy"], r"policies\.listener\.optim\.schedule.*wavy"),
    (["policies.listener.extra=1"], r"policies\.listener\.extra.*policy, optim"),
    (["policies.listener.policy.backend=vllm"], r"policies\.listener\.policy\.backend"),
    (["+policies.Listener.policy.name=vlm"], r"policies\.Listener.*lowercase"),
    (["asynchronous.enabled=true", "asynchronous.interrupt=true"], r"asynchronous\.interrupt.*mid-episode"),
    (["asynchronous.enabled=true", "asynchronous.reward_workers=1"], r"asynchronous\.reward_workers.*played"),
    (["distributed.strategy=fsdp"], r"distributed\.strategy.*ddp"),
    (["train.ema_decay=0.9"], r"train\.ema_decay"),
])
def test_roles_errors_name_the_key_at_load(overrides, match):
    overrides = [o.lstrip("+") for o in overrides]
    with pytest.raises(ConfigError, match=match):
        load_config(TEAM, overrides)


def test_a_team_runs_asynchronously_and_with_tools():
    cfg = load_config(TEAM, ["asynchronous.enabled=true", "asynchronous.max_staleness=1"])
    assert cfg.asynchronous.enabled and cfg.policies["listener"].policy.name == "vlm"
    assert load_config(TEAM, ["tools=[zoom]"]).tools == ["zoom"]


def test_named_policies_need_a_multi_role_env(tmp_path):
    node = OmegaConf.load(TEAM)
    del node.env
    node.data = {"train": "shapes_world.standins:counting"}
    node.eval = {"every": 0}
    path = tmp_path / "no_env.yaml"
    OmegaConf.save(node, path)
    with pytest.raises(ConfigError, match=r"'policies'.*multi-role"):
        load_config(str(path))


def test_roles_checked_against_the_environment(tmp_path):
    from envs import make_env

    cfg = load_config(TEAM)
    roles = roles_of(cfg, make_env("signal", {}))
    assert list(roles) == ["speaker", "listener"] and roles["listener"].policy == "listener"
    with pytest.raises(ConfigError, match=r"env\.roles.*\['listener', 'speaker'\].*roles \['first', 'second'\]"):
        roles_of(cfg, make_env("matching", {}))
    with pytest.raises(ConfigError, match=r"env\.roles.*has none"):
        roles_of(cfg, make_env("frozenlake", {}))
    node = OmegaConf.load(TEAM)
    del node.policies
    node.env = {"name": "matching"}
    OmegaConf.save(node, tmp_path / "shared.yaml")
    plain = load_config(str(tmp_path / "shared.yaml"))              # no env.roles: the policy section plays all
    assert {r: c.policy for r, c in roles_of(plain, make_env("matching", {})).items()} == {"first": "policy",
                                                                                          "second": "policy"}
    assert roles_of(load_config(os.path.join(REPO, "configs", "tiny", "agent_tiny.yaml")),
                    make_env("frozenlake", {})) is None
