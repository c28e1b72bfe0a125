"""Each GPU recipe loads, and its training plan builds with the model swapped for a tiny one of the
same family, a cheap reward and the tiny prompts (nothing is downloaded)."""

import os

import pytest
import torch

from diffusion import timesteps
from tests import REPO
from mmrl.config import load_config

RECIPES = {"sd35m_flow_grpo.yaml": ("sd3", 9), "flux_dev_dance_grpo.yaml": ("flux", 10),
           "sd15_ddpo.yaml": ("sd", 50), "sd35m_nft.yaml": ("sd3", 10), "wan21_flow_grpo.yaml": ("wan", 19),
           "wan21_dance_grpo.yaml": ("wan", 10)}  # file -> (family, trained steps per sample)


def recipe(name):
    return os.path.join(REPO, "configs", "diffusion", name)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_loads_as_written(name):
    cfg = load_config(recipe(name))
    assert cfg.policy.name == "diffusion" and not cfg.policy.model.startswith("tiny:")
    timesteps.validate(cfg.policy.timesteps, cfg.policy.rollout_steps)
    if cfg.algo.objective == "nft":  # DiffusionNFT: no ratio to clip; CFG-free rollouts, 9 of 10 flow times
        assert cfg.policy.guidance_scale == 1.0 and cfg.algo.nft.timesteps == 9
    else:
        assert cfg.algo.clip_low <= 1e-3 and cfg.algo.clip_high <= 1e-3  # the tiny clip ranges of the anchors


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_training_plan_builds_on_a_tiny_model(name, tmp_path):
    from mmrl.loop.trainer import setup

    family, t = RECIPES[name]
    overrides = [f"policy.model=tiny:{family}", "policy.height=16", "policy.width=16", "policy.max_sequence_length=8",
                 "rewards=[jpeg_compressibility]", "precision=fp32", "cpu=true", f"output_dir={tmp_path}"]
    if family == "wan":  # a 5-frame clip; single-process (the recipe's FSDP needs a launcher)
        overrides += ["policy.num_frames=5", "distributed.strategy=ddp"]
    if load_config(recipe(name)).data.train == "diffusion.prompts:lines":  # a prompt file the user supplies
        (tmp_path / "prompts.txt").write_text("a red circle\n\na blue square\n")
        path = tmp_path / "prompts.txt"
        overrides += [f"data.train_kwargs.path={path}", f"data.eval_kwargs.path={path}"]
    cfg = load_config(recipe(name), overrides)
    run = setup(cfg)
    policy = run.policy
    if cfg.data.train == "diffusion.prompts:lines":
        assert run.records == [{"prompt": "a red circle"}, {"prompt": "a blue square"}]
    assert policy.family.name == family and len(policy.sched) == cfg.policy.rollout_steps
    assert len(policy.eval_sched) == cfg.policy.eval_steps
    plan = timesteps.plan(cfg.policy.timesteps, cfg.policy.rollout_steps, 2, 0, torch.Generator().manual_seed(0))
    assert timesteps.trained_index(plan.trained)[0].shape == (2, t)
    rank = cfg.policy.lora.rank
    names = [n for n, p in policy.denoiser.named_parameters() if p.requires_grad]
    if rank:
        a = next(p for n, p in policy.denoiser.named_parameters() if "lora_A" in n)
        assert a.shape[0] == rank and all("lora_" in n for n in names)
    else:
        assert len(names) == len(list(policy.denoiser.parameters()))  # full fine-tuning
        assert (policy.reference_model is not None) == cfg.policy.reference
    assert run.params == policy.trainable_parameters()
    if cfg.algo.objective == "nft":  # the old (sampling) policy: a copy of the LoRA
        assert policy.nft_old is not None and policy.nft_old.params == run.params
