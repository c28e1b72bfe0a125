"""Held-out evaluation: the policy's deterministic output (greedy tokens, ODE images) on a
fixed prompt set, scored by the run's rewards, logged as `eval/reward/...`, and by the diagnostics of
`eval.diagnostics` (reward entries that measure quality but are never trained on), logged as
`eval/quality/<label>` (the mean over the held-out outputs it could score). With an EMA
(`train.ema_decay > 0`) the outputs come from the averaged weights (`mmrl.loop.ema`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from mmrl.algorithms.advantages import weighted_total
from mmrl.data import eval_seed
from mmrl.episodes import EpisodeMeta, eval_success, tool_metrics
from mmrl.loop.ema import averaged_weights
from mmrl.reporting.samples import write_samples, write_strip
from mmrl.types import PromptBatch


def _episode_strip(path: str, samples: list) -> None:
    """The first held-out episode as an image strip: each observation with the move made from it, then the
    final observation (`episode_strip` in the samples folder; before_after.png compares the first and last). In a
    multi-role run, the first joint episode: every role's observations with its replies (`role: move`), in the
    environment's role order, the last caption saying whether the team solved it."""
    meta = samples[0].meta
    if EpisodeMeta.ROLE in meta:
        joint = [s for s in samples if s.meta.get(EpisodeMeta.SEED) == meta.get(EpisodeMeta.SEED)]
        images, captions = [], []
        for s in joint:
            shown = list(s.images)[:len(reply_labels(s.meta))]
            images += shown
            captions += [f"{s.meta[EpisodeMeta.ROLE]}: {label}" for label in reply_labels(s.meta)[:len(shown)]]
        if images:
            end = "solved" if joint[-1].meta.get(EpisodeMeta.SUCCESS) else "not solved"
            write_strip(path, images, captions[:-1] + [f"{captions[-1]} ({end})"])
        return
    final = meta.get(EpisodeMeta.FINAL_IMAGE)
    images = list(samples[0].images) + ([final] if final is not None else [])
    if not images:
        return
    end = "solved" if meta.get(EpisodeMeta.SUCCESS) else "not solved"
    write_strip(path, images, reply_labels(meta) + [end])


def _call_label(call: dict) -> str:
    arguments = call.get("arguments")
    shown = ", ".join(str(v) for v in arguments.values()) if isinstance(arguments, dict) else "..."
    return f"{call.get('name') or '?'}({shown})"


def reply_labels(meta: dict) -> list[str]:
    """One label per reply of an episode: its tool calls (`zoom(top-right)`), else its action, else "(invalid)"."""
    calls = meta.get(EpisodeMeta.TOOL_CALLS) or []
    labels = []
    for i, action in enumerate(meta.get(EpisodeMeta.ACTIONS, [])):
        made = calls[i] if i < len(calls) else []
        labels.append("; ".join(map(_call_label, made)) if made else action if action is not None else "(invalid)")
    return labels


def _by_task(samples: list, total: torch.Tensor) -> dict:
    """`eval/task/<task>/reward/mean` for the records that name a `task` (a question kind, a data source),
    so a run shows which kind of held-out prompt improved; {} when no record names one."""
    groups: dict[str, list[float]] = {}
    for s, r in zip(samples, total.tolist()):                                  # total: [M]
        task = (s.meta or {}).get("task")
        if isinstance(task, str) and not math.isnan(r):
            groups.setdefault(task, []).append(r)
    return {f"eval/task/{t}/reward/mean": sum(v) / len(v) for t, v in sorted(groups.items())}


@dataclass(frozen=True)
class Evaluator:
    """Held-out evaluation, built by keyword from what it uses; `evaluator(step)` scores `Evaluates.generate_eval`
    on the held-out records (every process the same prompts, so the values agree).

    policy, rewards:    the policy (its capability `Evaluates`) and the run's RewardSet.
    records:            the held-out records (the first eval.max_prompts), seeded by `eval_seed(seed, index)`.
    prompts_per_batch:  held-out prompts per `generate_eval` call.
    episodes:           multi-turn episodes (env section): eval/success and the episode strip are added.
    samples_dir:        where the eval samples are written (the main process), or None (the others).
    ema:                the weights' average (`mmrl.loop.ema`) to evaluate with, or None for the trained weights.
    diagnostics:        eval.diagnostics as a RewardSet (measured, never trained on), or None.
    """

    policy: object
    rewards: object
    records: list
    seed: int
    prompts_per_batch: int
    episodes: bool
    samples_dir: str | None
    ema: object = None
    diagnostics: object = None

    def __call__(self, step: int) -> dict:
        records, bs, samples = self.records, self.prompts_per_batch, []
        with averaged_weights(self.ema):             # the trained weights are back, bit for bit, after the block
            for lo in range(0, len(records), bs):
                idx = list(range(lo, min(lo + bs, len(records))))
                batch = PromptBatch(rows=[records[i] for i in idx], index=idx,
                                    seeds=[eval_seed(self.seed, i) for i in idx], step=-1)
                samples += self.policy.generate_eval(batch)
        scores, metrics = self.rewards.score(samples)                           # [M, K]
        total = weighted_total(scores, self.rewards.weights)                    # [M]
        valid = total[~torch.isnan(total)]
        out = {f"eval/{k}": v for k, v in metrics.items() if not k.startswith("time/")}  # times: training steps only
        out["eval/reward/mean"] = float(valid.mean()) if valid.numel() else math.nan
        out.update(_by_task(samples, total))
        labels, diag = self.rewards.labels, self.diagnostics
        if diag is not None:                                                    # measured, never trained on
            quality, q_metrics = diag.score(samples)                            # [M, D]
            out.update({f"eval/quality/{label}": q_metrics[f"reward/{label}/mean"] for label in diag.labels})
            scores, labels = torch.cat([scores, quality], 1), labels + [f"quality/{x}" for x in diag.labels]
        success = eval_success(samples) if self.episodes else None
        if success is not None:
            out["eval/success"] = success
        if self.episodes:                                                       # held-out tool use (greedy episodes)
            out.update({f"eval/{k}": float(m.value) for k, m in tool_metrics(samples).items()})
        if self.samples_dir is not None:
            path = os.path.join(self.samples_dir, f"eval_step_{step:06d}.jsonl")
            write_samples(path, samples, scores, labels, totals=total)
            if self.episodes and samples:
                _episode_strip(os.path.splitext(path)[0] + "_episode.png", samples)
        return out
