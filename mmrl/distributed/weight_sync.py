"""How an asynchronous run's rollout workers get the learner's weights (`asynchronous.weight_sync`, the `WEIGHT_SYNC`
registry: one `WeightSync` per entry).

A version's trainable tensors go from the learner (process 0) to a rollout worker when the worker starts a plan with
a version it does not hold, or, with interruptible rollouts, when it takes an offered one. Each call to a worker
carries a *handle* of its plan's version (`Publisher.handle`); the worker's `Receiver.fetch` turns (version, handle)
into tensors shaped like its own trainable parameters, only when it lacks that version.

    object_store  the learner puts a CPU copy of the tensors in Ray's object store once per version; the handle is
                  the object's ref, which the worker fetches (shared memory on the learner's node, Ray's transfer to
                  another node)
    gloo          a `torch.distributed` process group of two ranks, the learner and one worker, over gloo: the worker
                  asks for a version and a thread of the learner sends that version's CPU tensors over the group, as
                  one flat buffer per dtype; the handle is only the version (nothing is pickled or copied into the
                  object store)
    nccl          the same over NCCL, from the learner's GPU to the worker's GPU, so the tensors never leave the
                  devices (written for GPUs, untested here: this machine has none)

One group per worker, not one broadcast group for all: a broadcast would make every worker take every version at the
same moment, while each worker here loads a version when its next plan starts, on its own schedule, and a worker
that Ray rebuilt after it died could not rejoin a group whose ranks are fixed. So each worker *incarnation* builds
its own pair group. The learner hosts a `TCPStore`; a worker takes a pair number from it (`add`) and marks that it
joins; the learner's accept thread then starts a thread for that pair, and both sides build the group under the
pair's prefix (a worker that took a number and died before marking is never waited for). A request is a store key
(`pair_<n>/request_<i>`: the version), which the pair's thread polls, so that it never sits inside a gloo call when
the run ends; the answer goes over the group: a header [status, tensors, elements], then one flat buffer per run of
tensors of one dtype (a version is a few sends, not one per tensor). A pair whose worker died ends with its
connection.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Protocol, Sequence

import torch
import torch.distributed as dist

from mmrl.registry import Registry

log = logging.getLogger("mmrl")

_PREFIX = "mmrl_weights/"
_PAIRS = _PREFIX + "pairs"        # the store's counter of pair numbers taken
_POLL_S = 0.01                    # how often a pair's thread looks for its worker's next request
_OK, _UNKNOWN = 0, 1              # header status: the version's tensors follow / the learner no longer holds it


class Publisher(Protocol):
    """The learner's side (process 0): what each call to a worker carries for a version."""

    def handle(self, version: int, tensors: Callable[[], list]) -> object:
        """The handle of `version` for a worker's call; `tensors()` gives the version's tensors as they are now (the
        learner's own, which its next update changes: the publisher copies what it keeps), called at most once per
        version."""

    def keep(self, versions: set) -> None:
        """Drop every version's tensors but these (the versions running plans started with, the newest, and the one
        before it, which a worker may have been offered just before the newest was published)."""

    def receiver_args(self) -> tuple:
        """The arguments a worker builds its `Receiver` from (picklable: they travel to the Ray actor)."""

    def close(self) -> None:
        """Stop serving."""


class Receiver(Protocol):
    """A rollout worker's side."""

    def fetch(self, version: int, handle: object, like: Sequence[torch.Tensor]) -> list:
        """The tensors of `version`, each shaped, typed and placed like `like`'s (the worker's trainable
        parameters)."""


@dataclass(frozen=True)
class WeightSync:
    """One `asynchronous.weight_sync` entry: `publisher(timeout_s)` on the learner, `receiver(*publisher's
    receiver_args, worker=, timeout_s=)` in each rollout worker; `device`: where the published tensors are kept
    ("cpu", or "learner": the learner's own device); `doc`: its line in `--help` and the docs."""

    publisher: Callable[..., Publisher]
    receiver: Callable[..., Receiver]
    device: str
    doc: str
    needs_gpus: bool = False


WEIGHT_SYNC: Registry = Registry("weight sync")


# --- object_store ------------------------------------------------------------------------------------------------
class ObjectStorePublisher:
    def __init__(self, timeout_s: float):
        self._put: tuple | None = None          # (version, Ray object ref) of the newest version put

    def handle(self, version: int, tensors: Callable[[], list]) -> object:
        import ray

        if self._put is None or self._put[0] != version:
            self._put = (version, ray.put([t.detach().to("cpu") for t in tensors()]))   # put copies them
        return self._put[1]

    def keep(self, versions: set) -> None:
        """Ray frees a version's object once no call that carries its ref is running."""

    def receiver_args(self) -> tuple:
        return ()

    def close(self) -> None:
        self._put = None


class ObjectStoreReceiver:
    def __init__(self, *, worker: int, timeout_s: float):
        self.worker, self.timeout_s = worker, timeout_s

    def fetch(self, version: int, handle: object, like: Sequence[torch.Tensor]) -> list:
        if isinstance(handle, (list, tuple)):                  # tensors passed as they are (a worker in process)
            return list(handle)
        import ray

        try:
            return ray.get(handle, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"rollout worker {self.worker}: the weights of version {version} did not arrive from "
                               f"the object store within asynchronous.timeout_s={self.timeout_s} s") from None


WEIGHT_SYNC.register("object_store")(WeightSync(
    ObjectStorePublisher, ObjectStoreReceiver, device="cpu",
    doc="a CPU copy of each version in Ray's object store, fetched by each worker that lacks it"))


# --- gloo and nccl: a process group per worker --------------------------------------------------------------------
def _pair_group(backend: str, store, pair: int, rank: int, timeout_s: float, device: torch.device):
    """The two-rank group of pair `pair` (rank 0: the learner, 1: the worker), on `store` under the pair's prefix."""
    prefixed = dist.PrefixStore(f"{_PREFIX}pair_{pair}/", store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, 2, timedelta(seconds=timeout_s))
    options = dist.ProcessGroupNCCL.Options()                  # untested here (no GPU)
    options._timeout = timedelta(seconds=timeout_s)
    torch.cuda.set_device(device)
    return dist.ProcessGroupNCCL(prefixed, rank, 2, options)


class PairPublisher:
    """The learner hosts the pairs' `TCPStore` and serves each pair from a thread of its own."""

    def __init__(self, timeout_s: float, *, backend: str, host: str | None = None):
        self.backend, self.timeout_s = backend, timeout_s
        self.device = _device(backend)          # taken here, on the learner's thread (NCCL: its GPU, not a default)
        self.host = host or _node_ip()
        self.store = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=timeout_s))
        self._versions: dict[int, list] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._threads: list = []                                # a serving thread per pair
        self.pairs = 0                                          # pairs served so far
        threading.Thread(target=self._accept, name="mmrl-weights-accept", daemon=True).start()

    def handle(self, version: int, tensors: Callable[[], list]) -> object:
        with self._lock:
            if version not in self._versions:
                made = tensors()
                self._versions[version] = (len(made), sum(t.numel() for t in made), _flat(made, self.device))
        return version

    def keep(self, versions: set) -> None:
        with self._lock:
            newest = max(self._versions, default=None)
            for v in [v for v in self._versions if v not in versions and v != newest]:
                del self._versions[v]

    def receiver_args(self) -> tuple:
        return (self.backend, self.host, self.store.port)

    def close(self) -> None:
        """Stop serving, and wait (up to 30 s) for the serving threads to end: one still inside a gloo call when the
        process exits would abort it ("terminate called ...")."""
        self._closed.set()
        with self._lock:
            self._versions.clear()
        deadline = time.monotonic() + min(30.0, self.timeout_s)
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    def _accept(self) -> None:
        """Start a serving thread for each pair whose worker has started building its end (`joining_<pair>`; a
        worker that took a pair number and died before that is never waited for)."""
        taken, waiting = 0, set()
        while not self._closed.is_set():
            try:
                now = self.store.add(_PAIRS, 0)
                waiting |= set(range(taken + 1, now + 1))
                taken = now
                joining = [p for p in sorted(waiting) if self.store.check([f"{_PREFIX}joining_{p}"])]
            except RuntimeError:                               # the store is gone: the run is ending
                return
            for pair in joining:
                waiting.discard(pair)
                t = threading.Thread(target=self._serve, args=(pair,), name=f"mmrl-weights-{pair}", daemon=True)
                self._threads.append(t)
                self.pairs += 1
                t.start()
            time.sleep(0.05)

    def _serve(self, pair: int) -> None:
        """Build the pair's group, then answer its worker's requests (`request_<n>` keys in the store, polled, so the
        thread ends soon after `close`) in order: a header, then the version's tensors over the group."""
        device = self.device
        try:
            # a client of its own: a store object serves one call at a time, and building a group waits in the store
            # until its worker's end is there, which must hold up neither the other pairs nor `_accept`
            store = dist.TCPStore(self.host, self.store.port, is_master=False,
                                  timeout=timedelta(seconds=self.timeout_s))
            group = _pair_group(self.backend, store, pair, 0, self.timeout_s, device)
            n = 0
            while not self._closed.is_set():
                key = f"{_PREFIX}pair_{pair}/request_{n}"
                if not store.check([key]):
                    time.sleep(_POLL_S)
                    continue
                version = int(store.get(key))
                store.delete_key(key)
                n += 1
                with self._lock:
                    held = self._versions.get(version)
                header = [_UNKNOWN, 0, 0] if held is None else [_OK, held[0], held[1]]
                group.send([torch.tensor(header, dtype=torch.int64, device=device)], 1, 1).wait()
                for buffer in held[2] if held is not None else []:
                    group.send([buffer], 1, 2).wait()
        except RuntimeError as e:          # the worker stopped, died or never connected: its pair ends here
            if not self._closed.is_set():
                log.info("async: weight pair %d closed (%s)", pair, (str(e).splitlines() or [""])[0])


class PairReceiver:
    """A worker's end of its pair: built at its first fetch (so a worker Ray rebuilt takes a new pair)."""

    def __init__(self, backend: str, host: str, port: int, *, worker: int, timeout_s: float):
        self.backend, self.host, self.port = backend, host, port
        self.worker, self.timeout_s = worker, timeout_s
        self.group, self.pair, self.store, self.requests = None, None, None, 0

    def fetch(self, version: int, handle: object, like: Sequence[torch.Tensor]) -> list:
        if isinstance(handle, (list, tuple)):                  # tensors passed as they are (a worker in process)
            return list(handle)
        try:
            header, tensors = self._transfer(version, like)
        except RuntimeError as e:
            self.group = None                                   # the next fetch takes a new pair
            raise RuntimeError(f"{self._where(version)} (learner at {self.host}:{self.port}): the weights did not "
                               f"arrive within asynchronous.timeout_s={self.timeout_s} s, or the connection broke: "
                               f"{e}") from None
        status, count, numel = header
        if status == _UNKNOWN:
            raise RuntimeError(f"{self._where(version)}: the learner no longer holds this version")
        return tensors

    def _where(self, version: int) -> str:
        return f"rollout worker {self.worker}, version {version}, {self.backend} pair {self.pair}"

    def _transfer(self, version: int, like: Sequence[torch.Tensor]) -> tuple:
        """Ask for `version`; its header (status, tensors, elements) and tensors."""
        device, timeout = _device(self.backend), timedelta(seconds=self.timeout_s)
        if self.group is None:
            self.store = dist.TCPStore(self.host, self.port, is_master=False, timeout=timeout)
            self.pair = self.store.add(_PAIRS, 1)
            self.store.set(f"{_PREFIX}joining_{self.pair}", "1")   # the learner builds its end once this is set
            self.group = _pair_group(self.backend, self.store, self.pair, 1, self.timeout_s, device)
            self.requests = 0
        self.store.set(f"{_PREFIX}pair_{self.pair}/request_{self.requests}", str(version))
        self.requests += 1
        header = torch.zeros(3, dtype=torch.int64, device=device)
        self.group.recv([header], 0, 1).wait(timeout)
        status, count, numel = (int(x) for x in header.tolist())
        if status != _OK:
            return (status, count, numel), []
        if count != len(like) or numel != sum(t.numel() for t in like):
            self.group = None        # the tensors are on their way: this pair is out of step, the next takes another
            raise ValueError(f"{self._where(version)}: the learner sends {count} tensors of {numel} elements, this "
                             f"worker's policy has {len(like)} of {sum(t.numel() for t in like)}")
        buffers = [torch.empty(sum(t.numel() for t in run), dtype=run[0].dtype, device=run[0].device)
                   for run in _runs(like)]
        for buffer in buffers:
            self.group.recv([buffer], 0, 2).wait(timeout)
        return (status, count, numel), _unflat(buffers, like)


def _runs(tensors: Sequence[torch.Tensor]) -> list[list]:
    """The tensors in runs of one dtype, in order: each run travels as one flat buffer."""
    runs: list[list] = []
    for t in tensors:
        if runs and runs[-1][0].dtype == t.dtype:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def _flat(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """A copy on `device` as one flat buffer per run of one dtype: a version goes as a few sends, not one per tensor
    (a LoRA policy has hundreds of small ones)."""
    return [torch.cat([t.detach().reshape(-1).to(device) for t in run]) for run in _runs(tensors)]


def _unflat(buffers: list[torch.Tensor], like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors shaped like `like`'s, as views of the received buffers."""
    out = []
    for buffer, run in zip(buffers, _runs(like)):
        offset = 0
        for t in run:
            out.append(buffer[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
    return out


def _device(backend: str) -> torch.device:
    """Where a pair's messages live: the CPU for gloo, this process's GPU for NCCL."""
    return torch.device("cpu") if backend == "gloo" else torch.device("cuda", torch.cuda.current_device())


def _node_ip() -> str:
    """This node's address as Ray knows it (where the workers can reach it), or the loopback without Ray."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


def _gloo(timeout_s: float) -> PairPublisher:
    return PairPublisher(timeout_s, backend="gloo")


def _nccl(timeout_s: float) -> PairPublisher:
    return PairPublisher(timeout_s, backend="nccl")


WEIGHT_SYNC.register("gloo")(WeightSync(
    _gloo, PairReceiver, device="cpu",
    doc="sent from the learner's CPU over a torch.distributed gloo group of two ranks per worker"))
WEIGHT_SYNC.register("nccl")(WeightSync(
    _nccl, PairReceiver, device="learner", needs_gpus=True,
    doc="sent from the learner's GPU to the worker's GPU over an NCCL group of two ranks per worker (untested here)"))
