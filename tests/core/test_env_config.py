"""The `env:` section is checked in full when the config is loaded, before any model or environment is built."""

from __future__ import annotations

import os

import pytest

from mmrl.config import ConfigError, EnvConfig, load_config, to_yaml
from mmrl.episodes import distinct_ngrams, episode_metrics, eval_records, eval_success, train_records
from tests import REPO

AGENT = os.path.join(REPO, "configs", "tiny", "agent_tiny.yaml")
CORRIDOR = os.path.join(REPO, "tests", "vlm", "agent_env.py") + ":Corridor"


def test_the_env_section_splits_its_own_keys_from_the_environments_arguments():
    cfg = load_config(AGENT, ["env.max_turns=4", "env.size=6"])
    assert isinstance(cfg.env, EnvConfig)
    assert cfg.env.name == "frozenlake" and cfg.env.max_turns == 4
    assert cfg.env.kwargs == {"size": 6, "slippery": False}


def test_a_written_config_loads_back_the_same(tmp_path):
    cfg = load_config(AGENT, ["env.size=5"])
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    again = load_config(str(path))
    assert again.env == cfg.env


@pytest.mark.parametrize("override,match", [
    ("env.name=frozenlak", r"env\.name.*unknown environment 'frozenlak'.*bandit, frozenlake, matching, signal, sokoban"),
    ("env.sizee=4", r"env\.sizee"),
    ("env.observation=video", r"env\.observation.*image, text, both"),
    ("env.max_turns=0", r"env\.max_turns.*>= 1"),
    ("env.history_turns=-1", r"env\.history_turns"),
    ("env.eval_seed_start=10", r"env\.eval_seed_start.*training seeds"),
    ("env.max_turns=many", r"env\.max_turns.*wrong type"),
    ("env.name=gym:FrozenLake-v9", r"env\.name.*FrozenLake"),
    ("policy.backend=vllm", r"policy\.backend.*hf backend"),
    ("data.train=shapes_world.standins:counting", r"data\.train.*not used with an env section"),
])
def test_env_section_errors_name_the_key_at_load(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(AGENT, [override])


def test_an_env_section_needs_a_policy_that_runs_episodes():
    bandit = os.path.join(REPO, "configs", "tiny", "bandit.yaml")
    with pytest.raises(ConfigError, match=r"policy 'bandit' does not run environment episodes"):
        load_config(bandit, ["env.name=frozenlake"])


def test_an_env_section_without_a_name_is_an_error(tmp_path):
    text = open(AGENT).read().replace("  name: frozenlake\n", "")
    path = tmp_path / "no_name.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"section 'env' must be a mapping with a 'name'"):
        load_config(str(path))


def with_env(tmp_path, env: dict) -> str:
    """agent_tiny.yaml with its env section replaced."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(AGENT)
    node.env = env
    path = tmp_path / "agent.yaml"
    OmegaConf.save(node, path)
    return str(path)


def test_user_and_gym_environments_are_accepted_by_reference(tmp_path):
    with pytest.raises(ConfigError, match=r"env\.size"):          # Corridor takes no `size`
        load_config(AGENT, [f"env.name={CORRIDOR}"])
    cfg = load_config(with_env(tmp_path, {"name": CORRIDOR, "length": 3}))
    assert cfg.env.kwargs == {"length": 3}
    cfg = load_config(with_env(tmp_path, {"name": "gym:FrozenLake-v1"}))
    assert cfg.env.name == "gym:FrozenLake-v1" and cfg.env.kwargs == {}


def test_training_and_held_out_seeds_are_disjoint():
    env = EnvConfig(name="frozenlake", train_seeds=10, eval_seed_start=1000)
    train = {r["env_seed"] for r in train_records(env)}
    held = {r["env_seed"] for r in eval_records(env, 5)}
    assert train == set(range(10)) and held == set(range(1000, 1005))


def test_distinct_ngrams_table():
    assert distinct_ngrams(["a b c", "a b c"]) == pytest.approx(2 / 4)
    assert distinct_ngrams(["a b", "c d"]) == 1.0
    assert distinct_ngrams(["left", "left", "right"]) == pytest.approx(2 / 3)
    assert distinct_ngrams([]) == 1.0


def test_episode_metrics_and_eval_success():
    import torch

    from rewards.sample import Sample

    def sample(turns, success, invalid, truncated, replies):
        return Sample("p", "o", meta={"turns": turns, "success": success, "invalid_actions": invalid,
                                      "truncated": truncated, "replies": replies})

    samples = [sample(2, True, 0, False, ["left", "right"]), sample(4, False, 2, True, ["left"] * 4),
               sample(1, True, 1, False, ["up"]), sample(3, False, 0, True, ["up"] * 3)]
    total = torch.tensor([1.0, 0.0, 1.0, 1.0])
    m = {k: v.value for k, v in episode_metrics(samples, total, 2).items()}
    assert m["env/turns/mean"] == pytest.approx(10 / 4)
    assert m["env/success"] == pytest.approx(0.5)
    assert m["env/invalid_action_frac"] == pytest.approx(3 / 10)
    assert m["env/truncated_frac"] == pytest.approx(0.5)
    assert m["env/reward_group_std"] == pytest.approx((0.5 + 0.0) / 2)        # population std per group
    assert eval_success(samples) == pytest.approx(0.5)
    assert eval_success([Sample("p", "o")]) is None
