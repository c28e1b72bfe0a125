"""`asynchronous.weight_sync` (mmrl/distributed/weight_sync.py): the learner's publisher and a worker's receiver of a
process group per worker (gloo), here in one process with the receivers on threads, as Ray's rollout workers would
be on processes: the tensors arrive bit for bit, each worker has its own pair, a worker that dies or is rebuilt
holds up no other, and every failure names the worker and the version. The runs on Ray are in test_async.py."""

from __future__ import annotations

import threading

import pytest
import torch

from mmrl.distributed.weight_sync import WEIGHT_SYNC


def _version(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, 4, generator=g), torch.randn(7, generator=g), torch.randint(0, 9, (2, 2), generator=g)]


@pytest.fixture
def gloo():
    entry = WEIGHT_SYNC.resolve("gloo", "asynchronous.weight_sync")
    publisher = entry.publisher(20.0)
    yield entry, publisher
    publisher.close()


def _receiver(entry, publisher, worker: int, timeout_s: float = 20.0):
    return entry.receiver(*publisher.receiver_args(), worker=worker, timeout_s=timeout_s)


def _on_thread(fn):
    """fn() on a thread of its own (a worker's process); its result or its exception."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:            # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the transfer hung"
    return out


def test_gloo_sends_each_version_bit_for_bit_to_each_worker(gloo):
    entry, publisher = gloo
    like = [torch.zeros(3, 4), torch.zeros(7), torch.zeros(2, 2, dtype=torch.int64)]
    made = []
    handle = publisher.handle(3, lambda: made.append(3) or _version(3))
    assert handle == 3 and publisher.handle(3, lambda: made.append("again")) == 3 and made == [3]   # made once
    publisher.handle(4, lambda: _version(4))
    workers = [_receiver(entry, publisher, i) for i in range(2)]
    got = [_on_thread(lambda w=w, v=v: w.fetch(v, v, like)) for w in workers for v in (3, 4)]
    for out, v in zip(got, [3, 4, 3, 4]):
        assert [torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(out["value"], _version(v))] == [True] * 3
    assert {w.pair for w in workers} == {1, 2}                  # one pair group per worker
    # tensors given as they are (a worker built in process) pass through
    assert workers[0].fetch(5, [torch.ones(1)], like)[0].item() == 1.0


def test_a_dropped_version_and_a_mismatched_policy_are_errors_naming_the_worker(gloo):
    entry, publisher = gloo
    like = [torch.zeros(3, 4), torch.zeros(7), torch.zeros(2, 2, dtype=torch.int64)]
    publisher.handle(1, lambda: _version(1))
    publisher.handle(2, lambda: _version(2))
    publisher.keep({2})                                         # no running plan needs version 1 any more
    worker = _receiver(entry, publisher, 5)
    out = _on_thread(lambda: worker.fetch(1, 1, like))
    assert "rollout worker 5, version 1, gloo pair 1: the learner no longer holds this version" in str(out["error"])
    out = _on_thread(lambda: worker.fetch(2, 2, like[:2]))      # a policy of other trainable tensors
    assert "rollout worker 5, version 2, gloo pair 1: the learner sends 3 tensors of 23 elements, this worker's " \
           "policy has 2 of 19" in str(out["error"])
    out = _on_thread(lambda: worker.fetch(2, 2, like))          # that pair was out of step: a new one serves it
    assert "value" in out and worker.pair == 2
    assert torch.equal(out["value"][0], _version(2)[0])


def test_a_worker_that_dies_or_is_rebuilt_holds_up_no_other(gloo):
    """A worker that takes a pair and never builds its group (killed right after), and a rebuilt worker (a new
    receiver of the same index): the others are served as before."""
    import torch.distributed as dist
    from datetime import timedelta

    entry, publisher = gloo
    like = [torch.zeros(3, 4), torch.zeros(7), torch.zeros(2, 2, dtype=torch.int64)]
    publisher.handle(0, lambda: _version(0))
    _, host, port = publisher.receiver_args()
    dead = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=5))
    assert dead.add("mmrl_weights/pairs", 1) == 1               # took pair 1, then "died"
    first = _receiver(entry, publisher, 0)
    assert torch.equal(_on_thread(lambda: first.fetch(0, 0, like))["value"][1], _version(0)[1])
    rebuilt = _receiver(entry, publisher, 0)                    # Ray rebuilt worker 0: a new pair
    assert torch.equal(_on_thread(lambda: rebuilt.fetch(0, 0, like))["value"][2], _version(0)[2])
    assert (first.pair, rebuilt.pair) == (2, 3)


def test_a_learner_that_is_gone_is_an_error_within_the_timeout():
    entry = WEIGHT_SYNC.resolve("gloo", "asynchronous.weight_sync")
    publisher = entry.publisher(20.0)
    publisher.close()                                           # serves nothing: no thread answers the pairs
    worker = _receiver(entry, publisher, 1, timeout_s=2.0)
    out = _on_thread(lambda: worker.fetch(0, 0, [torch.zeros(1)]))
    message = str(out["error"])
    assert message.startswith("rollout worker 1, version 0, gloo pair ") and "asynchronous.timeout_s=2.0 s" in message


def test_object_store_is_the_default_and_the_names_are_checked_at_load():
    from mmrl.config import ConfigError, load_config
    from tests import BANDIT

    assert load_config(BANDIT, ["asynchronous.enabled=true"]).asynchronous.weight_sync == "object_store"
    assert WEIGHT_SYNC.names() == ["gloo", "nccl", "object_store"]
    with pytest.raises(ConfigError, match="asynchronous.weight_sync.*gloo, nccl, object_store"):
        load_config(BANDIT, ["asynchronous.enabled=true", "asynchronous.weight_sync=udp"])
    with pytest.raises(ConfigError, match=r"'asynchronous.weight_sync' is nccl, which sends CUDA tensors .* it needs "
                                          r"cpu=false and asynchronous.gpus_per_worker > 0"):
        load_config(BANDIT, ["asynchronous.enabled=true", "asynchronous.weight_sync=nccl"])
