"""The synchronous trainer: each step the learner updates on the generator's next batch and the generator receives
the new weights; then log, evaluate, checkpoint.

Read top to bottom: `setup` builds the run (accelerator, policy, rewards, data, optimizer, the two roles,
resume), `train` runs the steps. The roles live in `mmrl.loop.collect` (`Generator`) and `mmrl.loop.update` (`Learner`).
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

from mmrl.algorithms.schedules import lr_lambda
from mmrl.config import Config, ConfigError, to_yaml
from mmrl.data import PromptSampler
from mmrl.distributed import memory, sharding
from mmrl.distributed.reduce import Accumulator, Metric, mean
from mmrl.loop.build import build_policy_for_run, build_rewards, run_records
from mmrl.loop.collect import Generator
from mmrl.loop.ema import EMA, build_ema
from mmrl.loop.evaluation import Evaluator
from mmrl.loop.team import step_samples
from mmrl.loop.update import Learner, samples_per_optimizer_step
from mmrl.roles import MAIN, policies_of, run_roles
from mmrl.reporting.console import header
from mmrl.reporting.metrics import MetricsSink, truncate_after
from mmrl.reporting.samples import write_samples
from mmrl.reporting.report import write_report
from mmrl.reporting.summary import before_after, plot_rewards, read_rows, summary_text
from mmrl.state import checkpoint
from mmrl.types import check_capabilities

log = logging.getLogger("mmrl")


@dataclass
class Run:
    """A built run: the two roles (`Generator`, `Learner`), the `Evaluator`, and where to resume; its own methods
    run the loop (`fit`) and write checkpoints (`save`). No function takes it: the roles and the evaluator are
    built from their parts."""

    cfg: Config
    accelerator: Accelerator
    generator: Generator             # or the asynchronous `mmrl.loop.asynchronous.controller.Controller` (same interface)
    learner: Learner
    evaluator: Evaluator | None      # None when there is no held-out evaluation
    start_step: int

    # the parts the roles share, for the trainer, evaluation and tests
    @property
    def policy(self):
        return self.learner.policy

    @property
    def rewards(self):
        return self.generator.rewards

    @property
    def records(self) -> list:
        return self.generator.records

    @property
    def ema(self) -> EMA | None:     # the average of `params` (train.ema_decay > 0), for eval and export
        return self.learner.ema

    @property
    def params(self) -> list:
        return self.learner.params

    @property
    def optimizer(self):
        return self.learner.optimizer

    @property
    def scheduler(self):
        return self.learner.scheduler

    @property
    def ckpt_dir(self) -> str:
        return os.path.join(self.cfg.output_dir, "checkpoints")

    def fit(self) -> None:
        """The step loop: each step the learner updates on the generator's next batch and the generator receives the
        new weights; metrics, evaluation and checkpoints around it."""
        cfg = self.cfg
        main = self.accelerator.is_main_process
        if main:
            os.makedirs(os.path.join(cfg.output_dir, "samples"), exist_ok=True)
            checkpoint.write_text_atomic(os.path.join(cfg.output_dir, "config.yaml"), to_yaml(cfg))
            truncate_after(os.path.join(cfg.output_dir, "metrics.jsonl"), self.start_step if self.start_step else -1)
            print(header(cfg, self.start_step), flush=True)  # the full config is in config.yaml
        sink = MetricsSink(cfg.output_dir, cfg, cfg.max_steps, self.start_step, enabled=main)
        try:
            if self.start_step == 0 and self.eval_due(0):
                sink.log({"step": 0, **self.evaluator(0)})
            for step in range(self.start_step, cfg.max_steps):
                t0 = time.perf_counter()
                batch = self.generator.next_batch(step)                    # rollout, rewards, filter, advantages
                t1 = time.perf_counter()
                row = {**batch.metrics, **self.learner.update(batch, step)}
                self.generator.receive(self.learner.version)                # the next batch samples the new weights
                row.update({"time/rollout_s": mean(t1 - t0), "time/update_s": mean(time.perf_counter() - t1)})
                row.update(memory.metrics(self.policy.model, self.optimizer))
                if cfg.logging.save_samples_every and (step + 1) % cfg.logging.save_samples_every == 0 and main:
                    samples, scores, advantages, rollouts = step_samples(batch)   # a team's: every policy's
                    write_samples(os.path.join(cfg.output_dir, "samples", f"step_{step + 1:06d}.jsonl"),
                                  samples, scores, self.rewards.labels, advantages,
                                  versions=_action_versions(rollouts))
                if self.eval_due(step + 1):
                    # every process evaluates the same prompts deterministically, so the values agree
                    row.update({k: mean(v) for k, v in self.evaluator(step + 1).items()})
                row["time/step_s"] = mean(time.perf_counter() - t0)
                sink.log({"step": step + 1, **_reduce_metrics(row)})
                every = cfg.checkpoint.every
                if (every and (step + 1) % every == 0) or step + 1 == cfg.max_steps:
                    self.save(step + 1)
        finally:
            sink.close()
        if main:
            rows = read_rows(cfg.output_dir)
            plot_rewards(cfg.output_dir, rows)
            before_after(cfg.output_dir)
            if rows:                                           # a run of 0 steps without evaluation logs nothing
                write_report(cfg.output_dir)
            print(f"mmrl: {summary_text(rows)}", flush=True)

    def eval_due(self, step: int) -> bool:
        every = self.cfg.eval.every
        return self.evaluator is not None and (step == 0 or step % every == 0 or step == self.cfg.max_steps)

    def save(self, step: int) -> None:
        """A checkpoint of both roles at `step` (every process writes its shards under FSDP)."""
        acc = self.accelerator
        acc.wait_for_everyone()
        if sharding.is_sharded(self.policy.model):              # every process writes its shards
            state = {**self.generator.state_dict(), **self.learner.state_dict()}
            checkpoint.save_sharded(self.ckpt_dir, step, self.policy, self.optimizer, self.scheduler, state,
                                    self.cfg.checkpoint.keep_last, self.ema, main=acc.is_main_process)
        elif acc.is_main_process:
            state = {**self.generator.state_dict(), **self.learner.state_dict()}
            checkpoint.save(self.ckpt_dir, step, self.policy, self.optimizer, self.scheduler, state,
                            self.cfg.checkpoint.keep_last, self.ema, members=self.learner.members())
        acc.wait_for_everyone()


def _resume_path(cfg: Config, ckpt_dir: str) -> str | None:
    """The checkpoint to resume from (None: a new run), after clearing what killed writes left in
    the run directory; a config that changes what is trained across a resume is an error
    (`mmrl.state.resume`)."""
    from accelerate import PartialState

    from mmrl.state.resume import check_unchanged

    state = PartialState()
    if state.is_main_process:
        for folder in (cfg.output_dir, ckpt_dir):
            cleaned = checkpoint.clean_stale(folder)
            if cleaned:
                log.info("removed what an interrupted run left in %s: %s", folder, ", ".join(cleaned))
    state.wait_for_everyone()  # every process then sees the same checkpoints
    if cfg.resume is None:
        found = checkpoint.latest(ckpt_dir)
        if found:
            raise ConfigError(f"output_dir {cfg.output_dir!r} already holds a run ({os.path.basename(found)}); "
                              "pass resume=auto to continue it, or another output_dir for a new run")
        return None
    path = checkpoint.latest(ckpt_dir) if cfg.resume == "auto" else cfg.resume
    if cfg.resume != "auto" and not os.path.isdir(path):
        raise ConfigError(f"config key 'resume': checkpoint {cfg.resume!r} does not exist")
    if path:
        check_unchanged(path, cfg)
    return path


def setup(cfg: Config) -> Run:
    acc = Accelerator(cpu=cfg.cpu or not torch.cuda.is_available(),
                      mixed_precision={"fp32": "no"}.get(cfg.precision, cfg.precision))
    set_seed(cfg.seed)
    if acc.distributed_type.name in ("FSDP", "DEEPSPEED"):
        raise ConfigError(f"launched with accelerate's {acc.distributed_type.name} plugin; mmrl shards the model "
                          "itself: launch without --use_fsdp / --use_deepspeed (accelerate launch --multi_gpu, or "
                          "torchrun) and set distributed.strategy=fsdp")
    p, world = cfg.train.prompts_per_step, acc.num_processes
    if p % world:
        raise ConfigError(f"train.prompts_per_step={p} must be divisible by the {world} processes")
    resume = _resume_path(cfg, os.path.join(cfg.output_dir, "checkpoints"))   # before anything is built
    rewards, diagnostics = build_rewards(cfg)
    records, eval_records = run_records(cfg)
    roles = run_roles(cfg)                     # None: one policy; else role -> RoleConfig (mmrl.roles)
    policy = build_policy_for_run(cfg, acc)
    check_capabilities(policy, kl_beta=cfg.algo.kl_beta, eval_every=cfg.eval.every, objective=cfg.algo.objective)
    fsdp = sharding.is_sharded(policy.model)
    n_local = p // world * (2 * cfg.algo.best_worst_k or cfg.train.group_size)  # samples trained per process and step
    plays = {name: sum(r.policy == name for r in roles.values()) for name in policies_of(roles)} if roles else {}
    learner = _learner(cfg, acc, policy, cfg.optim, n_local * plays.get(MAIN, 1), fsdp)
    team = None
    if roles is None:
        generator = Generator(policy=policy, rewards=rewards, records=records,
                              sampler=PromptSampler(len(records), cfg.seed), seed=cfg.seed, train=cfg.train,
                              algo=cfg.algo, episodes=cfg.env is not None, process_index=acc.process_index,
                              prompts_per_process=p // world)
    else:                                 # several roles: a generator and a learner per policy (mmrl.loop.team)
        generator, learner, team = _team(cfg, acc, roles, plays, learner, rewards, records, n_local)
    optimizer, scheduler = learner.optimizer, learner.scheduler
    if cfg.asynchronous.enabled:          # rollout workers on Ray sample; these processes learn (mmrl.loop.asynchronous)
        from mmrl.loop.asynchronous.launch import start
        from mmrl.loop.asynchronous.follower import Follower

        # the weights the rollouts sample with: DiffusionNFT's old copy, else the trained ones (FSDP2: shards)
        # a team's: every policy's trainable tensors, one version for all (each updates once per step)
        published = policy.old_parameters() if cfg.algo.objective == "nft" else learner.published()
        if acc.is_main_process:
            generator = start(cfg, generator, published, world=world, sharded=fsdp)
        else:                             # process 0 sends this process its share of each step batch
            generator = Follower(generator, published, sharded=fsdp)
    evaluator = None
    if eval_records is not None:
        evaluator = Evaluator(policy=team or policy, rewards=rewards, records=eval_records[:cfg.eval.max_prompts],
                              seed=cfg.seed, prompts_per_batch=cfg.eval.prompts_per_batch,
                              episodes=cfg.env is not None, ema=learner.ema, diagnostics=diagnostics,
                              samples_dir=os.path.join(cfg.output_dir, "samples") if acc.is_main_process else None)
    run = Run(cfg, acc, generator, learner, evaluator, 0)
    if resume:
        state = checkpoint.load(resume, policy, optimizer, scheduler, learner.ema, members=learner.members())
        generator.load_state_dict(state)
        learner.load_state_dict(state)
        run.start_step = int(state["step"])
        learner.version = generator.version = run.start_step    # one update per training step
        log.info("resumed from %s at step %d", resume, run.start_step)
    return run


def _learner(cfg: Config, acc: Accelerator, policy, optim, n_local: int, fsdp: bool) -> Learner:
    """The learning role of `policy`: AdamW over its trainable parameters with the `optim` section's settings and
    schedule over the run's optimizer steps (`n_local` samples trained per process and step)."""
    params = list(policy.trainable_parameters())
    if not params:
        raise ConfigError("the policy has no trainable parameters (check its LoRA / freezing options)")
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps,
                                  weight_decay=optim.weight_decay)
    per_opt = samples_per_optimizer_step(cfg.train, n_local)
    total_opt_steps = cfg.max_steps * cfg.train.update_epochs * math.ceil(n_local / per_opt)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim.schedule, optim.warmup_steps,
                                                                       total_opt_steps))
    if fsdp:  # already sharded by mmrl (accelerate's own FSDP path does not run on CPU)
        optimizer, scheduler = acc.prepare(optimizer, scheduler)
    else:
        policy.model, optimizer, scheduler = acc.prepare(policy.model, optimizer, scheduler)
    return Learner(policy=policy, optimizer=optimizer, scheduler=scheduler, params=params, accelerator=acc,
                   ema=build_ema(params, cfg.train), train=cfg.train, optim=optim, algo=cfg.algo, seed=cfg.seed)


def _team(cfg: Config, acc: Accelerator, roles: dict, plays: dict, main: Learner, rewards, records, n_local: int):
    """(TeamGenerator, TeamLearner, the adapter's team) of a multi-role run: each named policy built from its
    section with its own optimizer, the team from all of them (`mmrl.loop.team`)."""
    from mmrl.config.policies import adapter
    from mmrl.loop.team import JointRounds, RoleGenerator, TeamGenerator, TeamLearner, member_config

    learners = {}
    for name in policies_of(roles):
        if name == MAIN:
            learners[name] = main
            continue
        sub = member_config(cfg, name)
        policy = build_policy_for_run(sub, acc)
        check_capabilities(policy, kl_beta=cfg.algo.kl_beta, eval_every=cfg.eval.every, objective=cfg.algo.objective)
        learners[name] = _learner(sub, acc, policy, sub.optim, n_local * plays[name], False)
    team = adapter(cfg.policy.name).build_team({n: lr.policy for n, lr in learners.items()}, roles, cfg.env,
                                               acc.device)
    p, world = cfg.train.prompts_per_step, acc.num_processes
    rounds = JointRounds(team=team, rewards=rewards, records=records, sampler=PromptSampler(len(records), cfg.seed),
                         seed=cfg.seed, train=cfg.train, process_index=acc.process_index, prompts_per_process=p // world)
    generators = {name: RoleGenerator(name=name, rounds=rounds, policy=lr.policy, rewards=rewards, records=records,
                                      sampler=rounds.sampler, seed=cfg.seed, train=cfg.train, algo=cfg.algo,
                                      episodes=True, process_index=acc.process_index,
                                      prompts_per_process=p // world * plays[name])
                  for name, lr in learners.items()}
    return TeamGenerator(rounds, generators), TeamLearner(learners, MAIN), team


def _action_versions(rollouts: list) -> list[list[int]] | None:
    """Per sample of the rollouts, the policy version of each of its actions (None when one has no versions)."""
    if any(r.versions is None for r in rollouts):
        return None
    return [v[m.bool()].tolist() for r in rollouts for v, m in zip(r.versions, r.mask)]


def _reduce_metrics(row: dict[str, Metric]) -> dict:
    """One step's metrics merged over processes, each by the reduction it was declared
    with where it was computed (mmrl.distributed.reduce); returns plain numbers."""
    return Accumulator().add(row).all_reduce().result()


def train(cfg: Config) -> str:
    """Run training to `cfg.max_steps`; returns the run directory. With asynchronous.learner_processes > 0 this
    process only starts the learner's Ray actors, each of which runs this function as one process of the learner
    (`mmrl.loop.asynchronous.learners`)."""
    a = cfg.asynchronous
    if a.enabled and a.learner_processes:
        from mmrl.loop.asynchronous.learners import INSIDE, train_on_ray

        if not os.environ.get(INSIDE):
            _resume_path(cfg, os.path.join(cfg.output_dir, "checkpoints"))   # a run already there: before any actor
            return train_on_ray(cfg, train)
    run = setup(cfg)
    try:
        run.fit()
    finally:
        run.generator.close()
    # every rank arrives before the process group goes: rank 0 writes the summary after the last step, and a
    # rank that destroys its group and exits meanwhile sometimes aborts in gloo ("terminate called ...")
    run.accelerator.wait_for_everyone()
    run.accelerator.end_training()  # destroys the process group: a rank exiting with live gloo threads may abort
    return cfg.output_dir
