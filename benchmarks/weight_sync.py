"""Asynchronous weight sync: Ray's object store against a gloo group per worker (`asynchronous.weight_sync`).

The learner's side runs here (the driver), a rollout worker's side in a Ray actor of its own process, as in a run.
Each timed call publishes a new version on the learner (`Publisher.handle`: the CPU copy of the tensors, and for the
object store its `ray.put`) and has the worker fetch it (`Receiver.fetch`), end to end: what a worker waits before it
samples a plan of a version it lacks. The two kinds alternate version by version (A, B, A, B, ...); every fetched
version is checked bit for bit in the worker. Cases: the trainable tensors of a LoRA-sized policy (many small
tensors) and of two full models (few large ones). Both kinds run on one node here, where the object store passes
the tensors through shared memory; across nodes Ray transfers the object and gloo sends over TCP (not measured
here). NCCL (GPU to GPU) is not measured: no GPU.

    python benchmarks/weight_sync.py [--repeats 5] [--cases lora_16mb,model_64mb,model_1gb]
"""

from __future__ import annotations

import torch

from common import Report, interleaved, machine, median, run, table

CASES = {                       # name -> (tensors, elements each)
    "lora_16mb": (400, 10_000),
    "model_64mb": (4, 4_000_000),
    "model_1gb": (16, 16_000_000),
}


def tensors_of(version: int, count: int, numel: int) -> list[torch.Tensor]:
    """A version's tensors: version + their position, so the worker can check every element it received."""
    return [torch.arange(numel, dtype=torch.float32).add_(version * 1000 + i) for i in range(count)]


class Worker:
    """A rollout worker's end (a Ray actor): receivers of both kinds, tensors shaped like the learner's."""

    def __init__(self, count: int, numel: int, receivers: dict, timeout_s: float):
        from mmrl.distributed.weight_sync import WEIGHT_SYNC

        torch.set_num_threads(1)
        self.like = [torch.empty(numel) for _ in range(count)]
        self.receivers = {kind: WEIGHT_SYNC.resolve(kind).receiver(*args, worker=0, timeout_s=timeout_s)
                          for kind, args in receivers.items()}

    def fetch(self, kind: str, version: int, handle: list) -> bool:
        got = self.receivers[kind].fetch(version, handle[0], self.like)
        count, numel = len(self.like), self.like[0].numel()
        return all(torch.equal(t, w) for t, w in zip(got, tensors_of(version, count, numel)))


def add_options(ap) -> None:
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))


def measure(args) -> Report:
    import ray

    from mmrl.distributed.weight_sync import WEIGHT_SYNC

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows, ratios = [], {}
    try:
        for case in args.cases.split(","):
            count, numel = CASES[case]
            publishers = {kind: WEIGHT_SYNC.resolve(kind).publisher(120.0) for kind in ("object_store", "gloo")}
            receivers = {kind: p.receiver_args() for kind, p in publishers.items()}
            worker = ray.remote(num_cpus=1)(Worker).remote(count, numel, receivers, 120.0)
            learner = tensors_of(0, count, numel)                     # the learner's live tensors
            version = {"v": 0}

            def publish_and_fetch(kind):
                version["v"] += 1
                v = version["v"]
                for i, t in enumerate(learner):                       # the update wrote the new version
                    t.fill_(0).add_(torch.arange(numel, dtype=torch.float32)).add_(v * 1000 + i)
                p = publishers[kind]
                p.keep({v})
                handle = p.handle(v, lambda: learner)                # as the controller: the live tensors
                assert ray.get(worker.fetch.remote(kind, v, [handle])), f"{kind}: version {v} arrived changed"

            # the fill above is part of both calls; time it alone to take it out
            def fill_only():
                for i, t in enumerate(learner):
                    t.fill_(0).add_(torch.arange(numel, dtype=torch.float32)).add_(i)

            times = interleaved({"object_store": lambda: publish_and_fetch("object_store"),
                                 "gloo": lambda: publish_and_fetch("gloo"), "fill": fill_only},
                                repeats=args.repeats, warmup=1)
            fill = median(times["fill"])
            mb = count * numel * 4 / 2**20
            store, gloo = (median(times[k]) - fill for k in ("object_store", "gloo"))
            ratios[case] = gloo / store
            rows += [[case, count, f"{mb:.0f}", "object_store", store, mb / 1024 / store, 1.0],
                     [case, count, f"{mb:.0f}", "gloo", gloo, mb / 1024 / gloo, gloo / store]]
            ray.kill(worker)
            for p in publishers.values():
                p.close()
    finally:
        ray.shutdown()
    header = ["case", "tensors", "MiB", "weight_sync", "s per version", "GiB/s", "/ object_store"]
    title = f"weight sync, learner -> one rollout worker on this node ({machine()}; median of {args.repeats})"
    headline = ("gloo / object_store seconds per version: "
                + ", ".join(f"{case} {r:.3f}" for case, r in ratios.items()))
    return Report([table(title, header, rows)], headline)


if __name__ == "__main__":
    run(__doc__, add_options, measure, quiet=True)
