"""Starting an asynchronous run on Ray: the cluster's resources checked against the section, the rollout and reward
workers built, and the `Controller` (mmrl/loop/asynchronous/controller.py) that drives them returned. The learner's
processes as Ray actors start in `mmrl.loop.asynchronous.learners`, which checks the resources the same way."""

from __future__ import annotations

import logging
import os

from mmrl.config.asynchronous import AsyncConfig
from mmrl.errors import ConfigError
from mmrl.loop.asynchronous.controller import Controller

log = logging.getLogger("mmrl")


def check_resources(a: AsyncConfig) -> None:
    """The Ray cluster holds what the section asks for, counted together: the rollout workers, the reward workers and
    the learner's processes when they are Ray actors (asynchronous.learner_processes); a ConfigError naming the keys
    otherwise."""
    import ray

    have = ray.cluster_resources()
    terms = []                             # (resource, count key, count, per-process key, amount per process)
    for count_key, count, role in (("rollout_workers", a.rollout_workers, "worker"),
                                   ("reward_workers", a.reward_workers, "reward_worker"),
                                   ("learner_processes", a.learner_processes, "learner")):
        terms += [(resource, count_key, count, f"{kind}_per_{role}", getattr(a, f"{kind}_per_{role}"))
                  for resource, kind in (("CPU", "cpus"), ("GPU", "gpus"))]
    terms += [(name, "rollout_workers", a.rollout_workers, f"worker_resources.{name}", amount)
              for name, amount in a.worker_resources.items()]
    terms += [(name, "learner_processes", a.learner_processes, f"learner_resources.{name}", amount)
              for name, amount in a.learner_resources.items()]
    for resource in dict.fromkeys(t[0] for t in terms):
        used = [t for t in terms if t[0] == resource and t[2] and t[4]]
        need = sum(count * per for _, _, count, _, per in used)
        if need > have.get(resource, 0.0) + 1e-9:
            asked = " + ".join(f"'asynchronous.{ck}' ({count}) x 'asynchronous.{pk}' ({per})"
                               for _, ck, count, pk, per in used)
            raise ConfigError(f"config keys {asked} need {need:g} {resource}s; the Ray cluster has "
                              f"{have.get(resource, 0.0):g}")


def start(cfg, local, params, world: int = 1, sharded: bool = False) -> Controller:
    """Ray up (this machine, or the cluster at asynchronous.address), the rollout workers built (each loads the
    config and builds its policy), checked against the cluster's resources first; on process 0 of a learner of
    `world` processes."""
    import ray

    from mmrl.config import to_yaml

    a = cfg.asynchronous
    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(address=a.address, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=True, configure_logging=False)
    try:
        check_resources(a)
    except ConfigError:
        if owns_ray:
            ray.shutdown()
        raise
    from mmrl.loop.asynchronous.worker import RewardWorker, RolloutWorker

    # a worker that dies is rebuilt and its running call sent again: the plan is sampled again from its seeds
    # offers of newer weights (asynchronous.interrupt) run on a thread of their own, beside the running plan
    actor = ray.remote(num_cpus=a.cpus_per_worker, num_gpus=a.gpus_per_worker, resources=dict(a.worker_resources),
                       max_restarts=a.max_restarts, max_task_retries=a.max_restarts,
                       concurrency_groups={"offers": 1})(RolloutWorker)
    text = to_yaml(cfg)
    threads = max(1, int(a.cpus_per_worker))
    # deferred log-probs are the first training forward's own values: right only for on-policy batches
    # (DiffusionNFT has no per-action log-probs: its loss replays the clean samples under the learner's old copy)
    behaviour = (a.max_staleness > 0 or cfg.algo.objective == "decoupled") and cfg.algo.objective != "nft"
    if a.max_staleness > 0 and cfg.algo.objective == "pg":
        log.warning("asynchronous.max_staleness=%d with algo.objective=pg clips around the stale behaviour policy; "
                    "algo.objective=decoupled anchors the clip at the current weights and weights each action by "
                    "pi_prox / pi_behav (AReaL, arXiv 2505.24298)", a.max_staleness)
    scores = a.reward_workers == 0                         # else the reward workers score
    from mmrl.distributed.weight_sync import WEIGHT_SYNC

    sync = WEIGHT_SYNC.resolve(a.weight_sync, "asynchronous.weight_sync")
    publisher = sync.publisher(a.timeout_s)                # the learner's side, before the workers that join it
    weights = (a.weight_sync, publisher.receiver_args())
    workers = [actor.remote(text, i, cwd=os.getcwd(), behaviour=behaviour, threads=threads, interrupt=a.interrupt,
                            scores=scores, weights=weights) for i in range(a.rollout_workers)]
    # a reward worker that dies is rebuilt likewise, and the plan it was scoring scored again
    scorer = ray.remote(num_cpus=a.cpus_per_reward_worker, num_gpus=a.gpus_per_reward_worker,
                        max_restarts=a.max_restarts, max_task_retries=a.max_restarts)(RewardWorker)
    scorers = [scorer.remote(text, i, cwd=os.getcwd(), threads=max(1, int(a.cpus_per_reward_worker)))
               for i in range(a.reward_workers)]
    try:
        placed = ray.get([w.ready.remote() for w in [*workers, *scorers]], timeout=a.timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise RuntimeError(f"async: the {a.rollout_workers} rollout workers and {a.reward_workers} reward workers "
                           f"were not built within asynchronous.timeout_s={a.timeout_s} s (does the cluster have the "
                           "resources?)") from None
    here = ray.get_runtime_context().get_node_id()
    for p in placed:
        where = "this node" if p["node"] == here else f"node {p['node'][:12]} ({p['ip']})"
        print(f"mmrl: {p['role']} {p['worker']} on {where}, pid {p['pid']}", flush=True)
    return Controller(section=a, workers=workers, local=local, params=params,
                      prompts_per_step=cfg.train.prompts_per_step, group_size=cfg.train.group_size,
                      max_steps=cfg.max_steps, owns_ray=owns_ray, scorers=scorers, world=world,
                      sharded=sharded, publisher=publisher, device=sync.device)
