"""A learner of several processes as Ray actors in a placement group (`asynchronous.learner_processes` > 0).

`mmrl train CONFIG asynchronous.enabled=true asynchronous.learner_processes=N` needs no torchrun: the command (the
driver) joins or starts Ray, reserves a placement group of N bundles (`cpus_per_learner`, `gpus_per_learner` and
`learner_resources` each, placed by `learner_placement`), and starts one `LearnerProcess` actor per bundle. Each
actor is one process of the learner as torchrun would start it: it sets the launch variables (RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT of actor 0's node, LOCAL_RANK 0: an actor sees only the devices Ray gave it) and runs
the same trainer (`mmrl.loop.trainer.train`, handed over by the driver), so DDP or FSDP2 run over torch.distributed
between the actors as between torchrun's processes; process 0 drives the rollout and reward workers
(`launch.start`, from inside its actor). The driver waits for all of them and stops the others as soon as one
fails, raising its error.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from mmrl.config.asynchronous import PLACEMENTS
from mmrl.errors import ConfigError

log = logging.getLogger("mmrl")

INSIDE = "MMRL_LEARNER_PROCESS"      # set in a learner actor: its `train` runs the trainer itself
_LOG_FLUSH_S = 1.0                   # Ray's log monitor forwards an actor's output about every 100-500 ms


class LearnerProcess:
    """One process of the learner (a Ray actor; a plain class otherwise)."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def address(self) -> dict:
        """Where this actor runs (node, ip, pid) and a free port on its node (process 0's is the rendezvous)."""
        from mmrl.loop.asynchronous.worker import placement

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return {**placement(self.rank, "learner process"), "port": port}

    def train(self, run, config_yaml: str, cwd: str, threads: int, master_addr: str, master_port: int) -> str:
        """`run(cfg)` (the trainer's `train`, handed over by the driver) as process `rank` of the learner."""
        from mmrl.loop.asynchronous.worker import load_run_config

        cfg = load_run_config(config_yaml, cwd, threads)          # drops any launch variables the actor inherited
        os.environ.update({"RANK": str(self.rank), "WORLD_SIZE": str(self.world), "LOCAL_RANK": "0",
                           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
                           INSIDE: "1"})
        return run(cfg)


def launched() -> bool:
    """Whether this process is one of a torchrun / accelerate launch of several processes."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and not os.environ.get(INSIDE)


def train_on_ray(cfg, run) -> str:
    """Run the learner as `asynchronous.learner_processes` Ray actors, each calling `run(cfg)` (the trainer's `train`,
    which Ray pickles by its module and name); returns the run directory."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from mmrl.config import to_yaml
    from mmrl.loop.asynchronous.launch import check_resources

    a = cfg.asynchronous
    n = a.learner_processes
    if launched():
        raise ConfigError(f"config key 'asynchronous.learner_processes' is {n}: the learner runs as Ray actors, but "
                          "this command was launched with torchrun (several processes); run `mmrl train` alone, or "
                          "set asynchronous.learner_processes=0 to learn in torchrun's processes")
    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(address=a.address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True,
                 configure_logging=False)
    actors, group = [], None
    try:
        check_resources(a)
        bundle = {"CPU": a.cpus_per_learner, **({"GPU": a.gpus_per_learner} if a.gpus_per_learner else {}),
                  **a.learner_resources}
        strategy = PLACEMENTS.resolve(a.learner_placement).strategy
        group = placement_group([dict(bundle) for _ in range(n)], strategy=strategy)
        try:
            ray.get(group.ready(), timeout=a.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"async: the placement group of the {n} learner processes ({bundle} each, "
                               f"asynchronous.learner_placement={a.learner_placement}) was not placed within "
                               f"asynchronous.timeout_s={a.timeout_s} s; the cluster has "
                               f"{ray.available_resources()} free") from None
        actor = ray.remote(num_cpus=a.cpus_per_learner, num_gpus=a.gpus_per_learner,
                           resources=dict(a.learner_resources))(LearnerProcess)
        actors = [actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=i)).remote(i, n) for i in range(n)]
        places = ray.get([x.address.remote() for x in actors], timeout=a.timeout_s)
        here = ray.get_runtime_context().get_node_id()
        for p in places:
            where = "this node" if p["node"] == here else f"node {p['node'][:12]} ({p['ip']})"
            print(f"mmrl: learner process {p['worker']} on {where}, pid {p['pid']}", flush=True)
        text, threads = to_yaml(cfg), max(1, int(a.cpus_per_learner))
        runs = {x.train.remote(run, text, os.getcwd(), threads, places[0]["ip"], places[0]["port"]): i
                for i, x in enumerate(actors)}
        out = None
        while runs:
            (done,), _ = ray.wait(list(runs), num_returns=1)
            rank = runs.pop(done)
            try:
                result = ray.get(done)
            except ray.exceptions.RayTaskError as e:       # the trainer's own error (a ConfigError, a RewardError, ...)
                log.error("async: learner process %d failed; stopping the others", rank)
                raise (e.cause if isinstance(e.cause, Exception) else e) from None
            except ray.exceptions.RayActorError as e:      # its process died
                raise RuntimeError(f"async: learner process {rank} died: {e}") from None
            out = result if rank == 0 else out
        time.sleep(_LOG_FLUSH_S)         # Ray forwards the actors' last printed lines (the run's summary) to this one
        return out
    finally:
        for x in actors:
            ray.kill(x)
        if group is not None:
            remove_placement_group(group)
        if owns_ray:
            ray.shutdown()
