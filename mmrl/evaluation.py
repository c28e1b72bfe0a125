"""Held-out evaluation: the policy's deterministic output (greedy tokens, ODE images) on a
fixed prompt set, scored by the run's rewards, logged as `eval/reward/...`."""

from __future__ import annotations

import math
import os

import torch

from mmrl.samples import write_samples
from mmrl.types import PromptBatch


def evaluate(run, step: int) -> dict:
    """Score `policy.generate_eval` on the first `eval.max_prompts` held-out records."""
    policy, cfg = run.policy, run.cfg
    if not hasattr(policy, "generate_eval"):
        raise RuntimeError(f"policy {cfg.policy.name!r} has no generate_eval(); set eval.every=0")
    records = run.eval_records[:cfg.eval.max_prompts]
    samples, bs = [], cfg.eval.prompts_per_batch
    for lo in range(0, len(records), bs):
        idx = list(range(lo, min(lo + bs, len(records))))
        batch = PromptBatch(rows=[records[i] for i in idx], index=idx,
                            seeds=[cfg.seed * 31 + i for i in idx], step=-1)
        samples += policy.generate_eval(batch)
    scores, metrics = run.rewards.score(samples)                            # [M, K]
    total = (scores * torch.tensor(run.rewards.weights)).sum(1)             # [M]
    valid = total[~torch.isnan(total)]
    out = {f"eval/{k}": v for k, v in metrics.items()}
    out["eval/reward/mean"] = float(valid.mean()) if valid.numel() else math.nan
    if run.accelerator.is_main_process:
        path = os.path.join(cfg.output_dir, "samples", f"eval_step_{step:06d}.jsonl")
        write_samples(path, samples, scores, run.rewards.labels)
    return out
