"""The training loop: rollout -> rewards -> advantages -> updates -> log -> checkpoint.

Read top to bottom: `setup` builds the run (accelerator, policy, rewards, data, optimizer,
resume), `train` runs the steps. The phases live in `mmrl.collect` and `mmrl.update`.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

from mmrl import checkpoint
from mmrl.collect import collect
from mmrl.config import Config, ConfigError, to_yaml
from mmrl.data import PromptSampler, load_records
from mmrl.dist import all_reduce
from mmrl.evaluation import evaluate
from mmrl.metrics import MetricsSink, truncate_after
from mmrl.policies import BuildContext, build_policy
from mmrl.samples import write_samples
from mmrl.summary import before_after, plot_rewards, read_rows, summary_text
from mmrl.update import update

log = logging.getLogger("mmrl")


@dataclass
class Run:
    """Everything a step needs; built once by `setup`."""

    cfg: Config
    accelerator: Accelerator
    policy: object
    rewards: object
    records: list
    eval_records: list | None
    sampler: PromptSampler
    optimizer: torch.optim.Optimizer
    scheduler: object
    params: list
    prompts_per_process: int
    start_step: int
    counters: dict

    @property
    def run_dir(self) -> str:
        return self.cfg.output_dir

    @property
    def ckpt_dir(self) -> str:
        return os.path.join(self.cfg.output_dir, "checkpoints")


def _lr_lambda(cfg: Config, total: int):
    warm, kind = cfg.optim.warmup_steps, cfg.optim.schedule
    if kind not in ("constant", "linear", "cosine"):
        raise ConfigError(f"config key 'optim.schedule' must be constant, linear or cosine; got {kind!r}")

    def f(i: int) -> float:
        if warm and i < warm:
            return (i + 1) / warm
        frac = min(1.0, (i - warm) / max(1, total - warm))
        return {"constant": 1.0, "linear": 1.0 - frac, "cosine": 0.5 * (1 + math.cos(math.pi * frac))}[kind]

    return f


def _resume_path(cfg: Config, ckpt_dir: str) -> str | None:
    if cfg.resume is None:
        found = checkpoint.latest(ckpt_dir)
        if found:
            raise ConfigError(f"output_dir {cfg.output_dir!r} already holds a run ({os.path.basename(found)}); "
                              "pass resume=auto to continue it, or another output_dir for a new run")
        return None
    if cfg.resume == "auto":
        return checkpoint.latest(ckpt_dir)
    if not os.path.isdir(cfg.resume):
        raise ConfigError(f"config key 'resume': checkpoint {cfg.resume!r} does not exist")
    return cfg.resume


def setup(cfg: Config) -> Run:
    from rewards.scorer import RewardSet, parse_specs

    acc = Accelerator(cpu=cfg.cpu or not torch.cuda.is_available(),
                      mixed_precision={"fp32": "no"}.get(cfg.precision, cfg.precision))
    set_seed(cfg.seed)
    p, world = cfg.train.prompts_per_step, acc.num_processes
    if p % world:
        raise ConfigError(f"train.prompts_per_step={p} must be divisible by the {world} processes")
    try:
        rewards = RewardSet(parse_specs(list(cfg.rewards)))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    records = load_records(cfg.data.train, cfg.data.train_kwargs, "data.train")
    eval_records = (load_records(cfg.data.eval, cfg.data.eval_kwargs, "data.eval")
                    if cfg.data.eval and cfg.eval.every > 0 else None)
    ctx = BuildContext(acc.device, cfg.seed, cfg.output_dir, cfg.precision, acc, cfg.algo.kl_beta)
    try:
        policy = build_policy(cfg.policy, ctx)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    params = list(policy.trainable_parameters())
    if not params:
        raise ConfigError("the policy has no trainable parameters (check its LoRA / freezing options)")
    opt = cfg.optim
    optimizer = torch.optim.AdamW(params, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps,
                                  weight_decay=opt.weight_decay)
    n_local = p // world * cfg.train.group_size
    per_opt = cfg.train.samples_per_microbatch * cfg.train.grad_accum_steps or n_local
    total_opt_steps = cfg.max_steps * cfg.train.update_epochs * math.ceil(n_local / per_opt)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg, total_opt_steps))
    policy.model, optimizer, scheduler = acc.prepare(policy.model, optimizer, scheduler)
    run = Run(cfg, acc, policy, rewards, records, eval_records, PromptSampler(len(records), cfg.seed),
              optimizer, scheduler, params, p // world, 0, {"skipped": 0, "streak": 0})
    resume = _resume_path(cfg, run.ckpt_dir)
    if resume:
        state = checkpoint.load(resume, policy, optimizer, scheduler)
        run.sampler.load_state_dict(state["sampler"])
        run.counters.update(state["counters"])
        run.start_step = int(state["step"])
        log.info("resumed from %s at step %d", resume, run.start_step)
    return run


def _save(run: Run, step: int) -> None:
    acc = run.accelerator
    acc.wait_for_everyone()
    if acc.is_main_process:
        state = {"sampler": run.sampler.state_dict(), "counters": dict(run.counters)}
        checkpoint.save(run.ckpt_dir, step, run.policy, run.optimizer, run.scheduler, state,
                        run.cfg.checkpoint.keep_last)
    acc.wait_for_everyone()


def _reduce_metrics(acc: Accelerator, row: dict) -> dict:
    """Combine scalar metrics over processes: failure counts are summed, maxima maxed,
    everything else averaged."""
    if acc.num_processes == 1:
        return row
    keys = sorted(k for k, v in row.items() if isinstance(v, (int, float)) and v is not None and k != "step")
    vals = [float(row[k]) for k in keys]
    mean, total, top = all_reduce(vals, "mean"), all_reduce(vals, "sum"), all_reduce(vals, "max")
    out = dict(row)
    for k, m, t, x in zip(keys, mean, total, top):
        out[k] = int(t) if k.endswith("/failed") else x if "max" in k else m
    return out


def _eval_due(run: Run, step: int) -> bool:
    every = run.cfg.eval.every
    return run.eval_records is not None and (step == 0 or step % every == 0 or step == run.cfg.max_steps)


def train(cfg: Config) -> str:
    """Run training to `cfg.max_steps`; returns the run directory."""
    fit(setup(cfg))
    return cfg.output_dir


def fit(run: Run) -> None:
    """The step loop of a built run."""
    cfg = run.cfg
    acc, main = run.accelerator, run.accelerator.is_main_process
    if main:
        os.makedirs(os.path.join(cfg.output_dir, "samples"), exist_ok=True)
        checkpoint.write_text_atomic(os.path.join(cfg.output_dir, "config.yaml"), to_yaml(cfg))
        truncate_after(os.path.join(cfg.output_dir, "metrics.jsonl"), run.start_step if run.start_step else -1)
        print(f"mmrl: resolved config\n{to_yaml(cfg)}", flush=True)
    sink = MetricsSink(cfg.output_dir, cfg, cfg.max_steps, run.start_step, enabled=main)
    try:
        if run.start_step == 0 and _eval_due(run, 0):
            sink.log({"step": 0, **evaluate(run, 0)})
        for step in range(run.start_step, cfg.max_steps):
            t0 = time.perf_counter()
            batch = collect(run, step)                                # rollout, rewards, filter, advantages
            t1 = time.perf_counter()
            row = {"step": step + 1, **batch.metrics, **update(run, batch, step)}
            row.update({"time/rollout_s": t1 - t0, "time/update_s": time.perf_counter() - t1})
            if cfg.logging.save_samples_every and (step + 1) % cfg.logging.save_samples_every == 0 and main:
                write_samples(os.path.join(cfg.output_dir, "samples", f"step_{step + 1:06d}.jsonl"),
                              batch.rollout.samples, batch.scores, run.rewards.labels, batch.advantages)
            if _eval_due(run, step + 1):
                row.update(evaluate(run, step + 1))
            row["time/step_s"] = time.perf_counter() - t0
            sink.log(_reduce_metrics(acc, row))
            every = cfg.checkpoint.every
            if (every and (step + 1) % every == 0) or step + 1 == cfg.max_steps:
                _save(run, step + 1)
    finally:
        sink.close()
    if main:
        rows = read_rows(cfg.output_dir)
        plot_rewards(cfg.output_dir, rows)
        before_after(cfg.output_dir)
        print(f"mmrl: {summary_text(rows)}", flush=True)
