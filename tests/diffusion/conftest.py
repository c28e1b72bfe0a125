"""Fixtures of the diffusion tests: tiny policies built in process from the tiny configs, and the
2-process launch. The factories hold no state, so they are session-scoped (module-scoped fixtures use them)."""

import os
import sys

import pytest
import torch

from mmrl.config import load_config
from mmrl.config.policies import BuildContext
from mmrl.types import PromptBatch
from tests import REPO

TINY = {"sd3": "sd3_tiny.yaml", "sd": "sd_tiny.yaml", "sd_v": "sd_tiny.yaml", "flux": "flux_tiny.yaml",
        "wan": "wan_tiny.yaml"}


def _tiny_config(kind: str) -> str:
    return os.path.join(REPO, "configs", "tiny", TINY[kind])


def _policy_config(kind: str, *overrides: str):
    extra = [f"policy.model=tiny:{kind}"] + [f"policy.{o}" for o in overrides]
    return load_config(_tiny_config(kind), extra).policy


@pytest.fixture(scope="session")
def tiny_config():
    """`tiny_config(kind)`: the path of the tiny config of family `kind` (sd3, sd, sd_v, flux, wan)."""
    return _tiny_config


@pytest.fixture(scope="session")
def policy_config():
    """`policy_config(kind, *overrides)`: the `policy:` section of the tiny config of `kind`, with dotted
    overrides (without 'policy.')."""
    return _policy_config


@pytest.fixture(scope="session")
def build_tiny():
    """`build_tiny(kind, *overrides, seed=0, **context)`: the tiny policy of `kind` built on the CPU in
    fp32 (`policy_config` overrides); `context` sets BuildContext fields (kl_beta, ratio_norm, ...)."""
    from diffusion.policy import build as build_policy

    def build(kind: str, *overrides: str, seed: int = 0, **context):
        torch.manual_seed(seed)
        ctx = BuildContext(device=torch.device("cpu"), seed=seed, output_dir="/tmp/unused", precision="fp32", **context)
        return build_policy(_policy_config(kind, *overrides), ctx)

    return build


@pytest.fixture(scope="session")
def prompts():
    """`prompts(texts, seeds=None, step=0)`: a PromptBatch of `texts` (seeds 1000, 1001, ... unless given)."""

    def batch(texts, seeds=None, step: int = 0) -> PromptBatch:
        seeds = list(seeds) if seeds is not None else [1000 + i for i in range(len(texts))]
        return PromptBatch(rows=[{"prompt": t} for t in texts], index=list(range(len(texts))), seeds=seeds, step=step)

    return batch


@pytest.fixture(scope="session")
def perturb_lora():
    """`perturb_lora(policy, scale=0.05, seed=1)`: move the LoRA weights off their zero-B start, as
    training would."""

    def perturb(policy, scale: float = 0.05, seed: int = 1) -> None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in policy.denoiser.named_parameters():
                if "lora_" in name:
                    p.add_(scale * torch.randn(p.shape, generator=gen))

    return perturb


@pytest.fixture(scope="session")
def two_process_command(free_port):
    """`two_process_command(*train_args)`: `accelerate launch` of `mmrl train ...` on 2 CPU processes
    (gloo, DDP) at a free port."""

    def command(*train_args: str) -> list[str]:
        accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
        return [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
                "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m", "mmrl", "train",
                *train_args]

    return command
