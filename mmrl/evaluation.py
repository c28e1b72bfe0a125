"""Held-out evaluation: the policy's deterministic output (greedy tokens, ODE images) on a
fixed prompt set, scored by the run's rewards, logged as `eval/reward/...`, and by the diagnostics of
`eval.diagnostics` (reward entries that measure quality but are never trained on), logged as
`eval/quality/<label>` (the mean over the held-out outputs it could score). With an EMA
(`train.ema_decay > 0`) the outputs come from the averaged weights (`mmrl.ema`)."""

from __future__ import annotations

import math
import os

import torch

from mmrl.advantages import weighted_total
from mmrl.data import eval_seed
from mmrl.ema import averaged_weights
from mmrl.episodes import EpisodeMeta, eval_success
from mmrl.samples import write_samples, write_strip
from mmrl.types import PromptBatch


def _episode_strip(path: str, sample) -> None:
    """The first held-out episode as an image strip: each observation with the move made from it, then the
    final observation (`episode_strip` in the samples folder; before_after.png compares the first and last)."""
    meta = sample.meta
    final = meta.get(EpisodeMeta.FINAL_IMAGE)
    images = list(sample.images) + ([final] if final is not None else [])
    if not images:
        return
    moves = [a if a is not None else "(invalid)" for a in meta.get(EpisodeMeta.ACTIONS, [])]
    end = "solved" if meta.get(EpisodeMeta.SUCCESS) else "not solved"
    write_strip(path, images, moves + [end])


def evaluate(run, step: int) -> dict:
    """Score `policy.generate_eval` (a member of the `Policy` protocol) on the first `eval.max_prompts`
    held-out records; a policy without evaluation raises a configuration error naming eval.every."""
    policy, cfg = run.policy, run.cfg
    records = run.eval_records[:cfg.eval.max_prompts]
    samples, bs = [], cfg.eval.prompts_per_batch
    with averaged_weights(run.ema):                  # the trained weights are back, bit for bit, after the block
        for lo in range(0, len(records), bs):
            idx = list(range(lo, min(lo + bs, len(records))))
            batch = PromptBatch(rows=[records[i] for i in idx], index=idx,
                                seeds=[eval_seed(cfg.seed, i) for i in idx], step=-1)
            samples += policy.generate_eval(batch)
    scores, metrics = run.rewards.score(samples)                            # [M, K]
    total = weighted_total(scores, run.rewards.weights)                     # [M]
    valid = total[~torch.isnan(total)]
    out = {f"eval/{k}": v for k, v in metrics.items() if not k.startswith("time/")}  # times: training steps only
    out["eval/reward/mean"] = float(valid.mean()) if valid.numel() else math.nan
    labels = run.rewards.labels
    if run.diagnostics is not None:                                         # measured, never trained on
        quality, q_metrics = run.diagnostics.score(samples)                 # [M, D]
        out.update({f"eval/quality/{label}": q_metrics[f"reward/{label}/mean"] for label in run.diagnostics.labels})
        scores, labels = torch.cat([scores, quality], 1), labels + [f"quality/{x}" for x in run.diagnostics.labels]
    success = eval_success(samples) if cfg.env is not None else None
    if success is not None:
        out["eval/success"] = success
    if run.accelerator.is_main_process:
        path = os.path.join(cfg.output_dir, "samples", f"eval_step_{step:06d}.jsonl")
        write_samples(path, samples, scores, labels)
        if cfg.env is not None and samples:
            _episode_strip(os.path.splitext(path)[0] + "_episode.png", samples[0])
    return out
