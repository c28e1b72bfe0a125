"""Shared by the diffusion tests: tiny policies built in-process from the tiny configs."""

import os

import torch

from mmrl.config import load_config
from mmrl.config.policies import BuildContext
from mmrl.types import PromptBatch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {"sd3": "sd3_tiny.yaml", "sd": "sd_tiny.yaml", "sd_v": "sd_tiny.yaml", "flux": "flux_tiny.yaml"}
FAMILIES = ["sd3", "sd", "sd_v", "flux"]


def tiny_config(kind: str) -> str:
    return os.path.join(REPO, "configs", "tiny", TINY[kind])


def policy_config(kind: str, *overrides: str):
    """The `policy:` section of the tiny config of `kind`, with dotted overrides (without 'policy.')."""
    extra = [f"policy.model=tiny:{kind}"] + [f"policy.{o}" for o in overrides]
    return load_config(tiny_config(kind), extra).policy


def build(kind: str, *overrides: str, seed: int = 0, kl_beta: float = 0.0):
    from diffusion.policy import build as build_policy

    torch.manual_seed(seed)
    ctx = BuildContext(device=torch.device("cpu"), seed=seed, output_dir="/tmp/unused", precision="fp32", kl_beta=kl_beta)
    return build_policy(policy_config(kind, *overrides), ctx)


def prompts(texts, seeds=None, step: int = 0) -> PromptBatch:
    seeds = list(seeds) if seeds is not None else [1000 + i for i in range(len(texts))]
    return PromptBatch(rows=[{"prompt": t} for t in texts], index=list(range(len(texts))), seeds=seeds, step=step)


def perturb_lora(policy, scale: float = 0.05, seed: int = 1) -> None:
    """Move the LoRA weights off their zero-B start, as training would."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.denoiser.named_parameters():
            if "lora_" in name:
                p.add_(scale * torch.randn(p.shape, generator=gen))


def two_process_command(*train_args: str) -> list[str]:
    """`accelerate launch` of `mmrl train ...` on 2 CPU processes (gloo, DDP) at a free port."""
    import socket
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    return [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
            "no", "--dynamo_backend", "no", "--main_process_port", str(port), "-m", "mmrl", "train", *train_args]
