"""Run the bandit under the current launcher and save every rank's parameters and EMA (rank 0)."""

import os
import sys

import torch
import torch.distributed as dist

from mmrl.config import load_config
from mmrl.distributed.dist import end_launched_process
from mmrl.loop.trainer import setup

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BANDIT = os.path.join(REPO, "configs", "tiny", "bandit.yaml")

if __name__ == "__main__":
    out, overrides = sys.argv[1], sys.argv[2:]
    run = setup(load_config(BANDIT, overrides))
    run.fit()
    world = run.accelerator.num_processes

    def gathered(t: torch.Tensor) -> list:
        ts = [torch.zeros_like(t) for _ in range(world)]
        if world > 1:
            dist.all_gather(ts, t)
        return ts if world > 1 else [t]

    thetas = gathered(run.policy.net.theta.detach().clone())
    averages = gathered(run.ema.shadow[0].clone()) if run.ema is not None else None
    if run.accelerator.is_main_process:
        torch.save({"world": world, "thetas": thetas, "averages": averages}, out)
    run.accelerator.wait_for_everyone()
    run.accelerator.end_training()  # without it rank 1 sometimes aborts at exit (live gloo threads)
    end_launched_process(0)         # and even with it, now and then, during interpreter teardown
