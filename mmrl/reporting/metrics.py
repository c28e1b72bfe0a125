"""Metric sinks: metrics.jsonl (always), TensorBoard and wandb (when asked and installed),
and the console progress (`mmrl.reporting.console`; `logging.progress`). Only the main process writes."""

from __future__ import annotations

import json
import math
import os

from mmrl.reporting.console import Progress
from mmrl.state.checkpoint import write_text_atomic


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; null means "no value this step"
    return value


def _step_of(line: str) -> int | None:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return None  # a line cut short by a kill


def truncate_after(path: str, step: int) -> None:
    """Drop rows logged after `step` (a resumed run logs those steps again) and any
    partial line a killed run left behind."""
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        rows = [line if line.endswith("\n") else line + "\n" for line in f
                if line.strip() and (_step_of(line) is not None and _step_of(line) <= step)]
    write_text_atomic(path, "".join(rows))


class MetricsSink:
    def __init__(self, run_dir: str, cfg, total_steps: int, start_step: int, enabled: bool = True, stream=None):
        """`stream`: where the progress goes (stderr when None)."""
        self.enabled = enabled
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.tb = self.wandb = self.progress = None
        if not enabled:
            return
        if cfg.logging.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise RuntimeError("logging.tensorboard=true needs the tensorboard extra: "
                                   "pip install 'mmrl[tensorboard]'") from e
            self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if cfg.logging.wandb:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("logging.wandb=true needs the wandb extra: pip install 'mmrl[wandb]'") from e
            self.wandb = wandb.init(project=cfg.logging.wandb_project, dir=run_dir, resume="allow")
        if cfg.logging.progress:
            self.progress = Progress(total_steps, start_step, stream)

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        row = {k: _clean(v) for k, v in row.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        step = row.get("step", 0)
        numeric = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self.tb:
            for k, v in numeric.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(numeric, step=step)
        if self.progress:
            self.progress.update(row)

    def close(self) -> None:
        if self.progress:
            self.progress.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
