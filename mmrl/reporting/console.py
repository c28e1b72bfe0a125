"""What a run prints while it trains: a short header, then its progress.

On a terminal the progress is a tqdm bar whose postfix holds the latest training reward, the
latest held-out reward (once measured) and seconds per step. Elsewhere (CI, a pipe, a log
file) a bar would be an unreadable stream of carriage returns, so a plain line is printed
at the first step, every tenth of the run and at its last step instead. The full resolved config goes to
`config.yaml`, not to the terminal.
"""

from __future__ import annotations

import os
import sys
import time

EVAL_KEY, REWARD_KEY, SECONDS_KEY = "eval/reward/mean", "reward/mean", "time/step_s"


def header(cfg, start_step: int = 0) -> str:
    """Two lines: run directory, policy and model, steps and batch; where the config went."""
    name, model = getattr(cfg.policy, "name", "?"), getattr(cfg.policy, "model", "")
    steps = f"{cfg.max_steps} steps" + (f" (resuming after step {start_step})" if start_step else "")
    t, env = cfg.train, getattr(cfg, "env", None)
    held_out = cfg.data.eval or env is not None
    evals = f"held-out eval every {cfg.eval.every} steps" if cfg.eval.every > 0 and held_out else "no eval"
    unit = f"environment {env.name} seeds x {t.group_size} trajectories" if env else f"prompts x {t.group_size} samples"
    return (f"mmrl: run {cfg.output_dir} | policy {name}{f' (model {model})' if model else ''} | {steps} of "
            f"{t.prompts_per_step} {unit} | {evals}\n"
            f"mmrl: config written to {os.path.join(cfg.output_dir, 'config.yaml')}")


def _num(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """Step progress of one run; `update(row)` takes each metrics row as it is logged."""

    def __init__(self, total_steps: int, start_step: int, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.total, self.every, self.first = total_steps, max(1, total_steps // 10), start_step + 1
        self.reward = self.eval_reward = self.eval_step = None
        self.bar, self._seconds, self._t0 = None, [], time.perf_counter()
        if _is_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc="mmrl", unit="step",
                            dynamic_ncols=True, file=self.stream)

    def _fields(self, seconds, trained: bool = True) -> str:
        parts = [f"reward {_num(self.reward)}"] if trained else []
        if self.eval_reward is not None:
            parts.append(f"eval reward {_num(self.eval_reward)} (step {self.eval_step})")
        if seconds is not None:
            parts.append(f"{seconds:.2f} s/step")
        return " | ".join(parts)

    def update(self, row: dict) -> None:
        step = int(row.get("step", 0))
        if row.get(EVAL_KEY) is not None:
            self.eval_reward, self.eval_step = row[EVAL_KEY], step
        if "loss" not in row and REWARD_KEY not in row:  # the evaluation before the first step
            if self.eval_reward is not None:
                self._show(step, None, final=False, trained=False)
            return
        self.reward = row.get(REWARD_KEY)
        if row.get(SECONDS_KEY) is not None:
            self._seconds.append(row[SECONDS_KEY])
        if self.bar is not None or step % self.every == 0 or step in (self.first, self.total):
            mean = sum(self._seconds) / len(self._seconds) if self._seconds else None
            self._show(step, mean, final=step == self.total)
            self._seconds = []

    def _show(self, step: int, seconds, final: bool, trained: bool = True) -> None:
        if self.bar is not None:  # a training row moves the bar one step, the step-0 evaluation does not
            self.bar.set_postfix_str(self._fields(seconds, trained), refresh=not trained)
            if trained:
                self.bar.update(1)
            return
        line = f"mmrl: step {step}/{self.total} | {self._fields(seconds, trained)}"
        if final:
            line += f" | {time.perf_counter() - self._t0:.0f} s in all"
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
