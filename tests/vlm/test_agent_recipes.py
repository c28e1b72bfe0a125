"""Every agent recipe (configs/agents/*.yaml) loads and runs one step with its model swapped for the tiny
Qwen2.5-VL and its sizes shrunk (no downloads, no GPU)."""

from __future__ import annotations

import glob
import json
import os

import pytest

from mmrl.config import load_config
from tests import REPO

RECIPES = sorted(glob.glob(os.path.join(REPO, "configs", "agents", "*.yaml")))


def test_there_are_agent_recipes_for_sokoban_and_frozenlake():
    names = {load_config(r).env.name for r in RECIPES}
    assert {"sokoban", "frozenlake"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=[os.path.basename(r)[:-5] for r in RECIPES])
def test_agent_recipe_runs_one_step_with_a_tiny_model(recipe, tmp_path):
    from mmrl.loop.trainer import train

    base = load_config(recipe)
    assert base.policy.model.startswith("Qwen/Qwen2.5-VL") and base.algo.kl_beta == 0.0
    assert base.algo.filter.name == "starpo" and base.algo.filter.keep_frac == 0.25      # RAGEN's StarPO-S
    cfg = load_config(recipe, [
        "policy.model=tiny:qwen2_5_vl", f"output_dir={tmp_path}", "max_steps=1", "precision=fp32",
        "eval.every=1", "eval.max_prompts=1", "checkpoint.every=0", "logging.save_samples_every=0",
        "policy.min_pixels=784", "policy.max_pixels=3136", "policy.max_new_tokens=4",
        "policy.gradient_checkpointing=false", "env.max_turns=2", "train.prompts_per_step=2",
        "train.group_size=2", "train.samples_per_microbatch=2", "train.grad_accum_steps=0"])
    train(cfg)
    with open(os.path.join(str(tmp_path), "metrics.jsonl")) as f:
        row = json.loads(f.readlines()[-1])
    assert row["step"] == 1 and "reward/env_return/mean" in row and "eval/success" in row
    for tool in base.tools:                                   # a recipe with tools logs their metrics
        name = tool if isinstance(tool, str) else tool["name"]
        assert f"tools/{name}/calls" in row and f"eval/tools/{name}/calls" in row
