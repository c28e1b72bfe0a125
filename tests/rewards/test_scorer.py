"""RewardSet: resolution, failure isolation, timeouts, and the errors that stop training."""

import math
import time

import pytest

import rewards
from rewards.scorer import RewardError, RewardSet, parse_specs
from rewards.sample import Sample


def samples(n):
    return [Sample(prompt=f"p{i}", output=str(i), id=f"sample {i}") for i in range(n)]


def odd_fails(batch):
    out = []
    for s in batch:
        if int(s.output) % 2:
            raise ValueError(f"cannot score {s.output}")
        out.append(1.0)
    return out


def test_parse_specs_reserved_keys_and_kwargs():
    (spec,) = parse_specs([{"name": "numeric", "weight": 2, "label": "acc", "timeout_s": 3, "rel_tol": 0.1}])
    assert (spec.name, spec.label, spec.weight, spec.timeout_s, spec.kwargs) == ("numeric", "acc", 2.0, 3.0,
                                                                                  {"rel_tol": 0.1})
    assert parse_specs(["format"])[0].label == "format"
    assert parse_specs([{"name": "pkg.mod:my_fn"}])[0].label == "my_fn"
    with pytest.raises(ValueError, match="used twice"):
        parse_specs(["format", "format"])
    with pytest.raises(ValueError, match=r"rewards\[0\]"):
        parse_specs([{"weight": 1}])


def test_raising_reward_is_isolated_per_sample(caplog):
    rs = RewardSet(parse_specs([{"name": f"{__file__}:odd_fails", "label": "odd"}]))
    scores, metrics = rs.score(samples(4))                      # [4, 1]
    assert scores[:, 0].tolist()[0::2] == [1.0, 1.0]
    assert all(math.isnan(v) for v in scores[:, 0].tolist()[1::2])
    assert metrics["reward/odd/failed"] == 2 and metrics["reward/odd/mean"] == 1.0
    assert "sample 1" in caplog.text and caplog.text.count("failed on") == 1   # first of its kind only


def test_none_nan_inf_and_non_numbers_are_unscorable():
    rs = RewardSet(parse_specs([{"name": f"{__file__}:weird", "max_fail_frac": 1.0}]))
    scores, metrics = rs.score(samples(5))
    assert scores[0, 0] == 1.0 and metrics["reward/weird/failed"] == 4


def weird(batch):
    return [1, None, float("nan"), float("inf"), "x"][: len(batch)]


def test_numbers_of_every_kind_become_floats():
    """bool, int, numpy and torch scalars and numeric strings are scores; -inf is unscorable like inf."""
    import numpy as np
    import torch

    from rewards.scorer import _as_float

    assert [_as_float(v) for v in (True, False, 3, np.float32(0.5), torch.tensor(2.0), "0.25")] == \
        [1.0, 0.0, 3.0, 0.5, 2.0, 0.25]
    assert all(math.isnan(_as_float(v)) for v in (None, float("-inf"), "1e999", [1.0], object()))


def a_float(batch):
    return 1.0


def test_a_reward_returning_no_list_stops_training_naming_the_type():
    rs = RewardSet(parse_specs([{"name": f"{__file__}:a_float", "label": "flat"}]))
    with pytest.raises(RewardError, match=r"^reward 'flat' returned float scores for 2 samples; a reward must "
                                          r"return one float or None per sample$"):
        rs.score(samples(2))


def test_too_many_failures_stop_with_the_first_error():
    rs = RewardSet(parse_specs([{"name": f"{__file__}:odd_fails", "label": "odd", "max_fail_frac": 0.25}]))
    with pytest.raises(RewardError, match=r"'odd' failed on 2 of 4 .*ValueError: cannot score"):
        rs.score(samples(4))


def short(batch):
    return [0.0] * (len(batch) - 1)


def test_wrong_length_stops_training():
    rs = RewardSet(parse_specs([{"name": f"{__file__}:short"}]))
    with pytest.raises(RewardError, match="returned 2 scores for 3 samples"):
        rs.score(samples(3))


def slow(batch):
    time.sleep(2.0)
    return [1.0] * len(batch)


def test_timeout_marks_the_batch_unscorable():
    rs = RewardSet(parse_specs([{"name": f"{__file__}:slow", "timeout_s": 0.2, "max_fail_frac": 1.0}]))
    t0 = time.perf_counter()
    scores, metrics = rs.score(samples(2))
    assert time.perf_counter() - t0 < 1.5
    assert metrics["reward/slow/failed"] == 2 and all(math.isnan(v) for v in scores[:, 0].tolist())


def threaded(batch):
    import threading

    name = threading.current_thread().name
    return [1.0 if name.startswith("mmrl-reward") else 0.0 for s in batch]


def test_a_reward_under_a_timeout_runs_in_a_named_worker_and_keeps_working_after_one():
    """With timeout_s a reward that answers in time is scored normally, in the 'mmrl-reward' worker thread;
    after a call that timed out, the next calls get a fresh worker and score again."""
    specs = parse_specs([{"name": f"{__file__}:threaded", "timeout_s": 5.0}])
    rs = RewardSet(specs)
    scores, metrics = rs.score(samples(3))
    assert scores[:, 0].tolist() == [1.0, 1.0, 1.0] and metrics["reward/threaded/failed"] == 0
    rs.fns[0] = slow
    rs.specs[0] = parse_specs([{"name": f"{__file__}:threaded", "timeout_s": 0.2, "max_fail_frac": 1.0}])[0]
    rs.score(samples(2))                                        # times out; its thread is left to finish
    rs.fns[0], rs.specs[0] = threaded, specs[0]
    scores, _ = rs.score(samples(2))
    assert scores[:, 0].tolist() == [1.0, 1.0]


def test_register_decorator_plain_and_factory():
    @rewards.register("test_len_plus")
    def length_plus(batch, bonus=0.0):
        return [len(s.output) + bonus for s in batch]

    @rewards.register("test_const", factory=True)
    def const_factory(value=1.0):
        return lambda batch: [value] * len(batch)

    try:
        assert rewards.resolve("test_len_plus", {"bonus": 1})(samples(2)) == [2.0, 2.0]
        assert rewards.resolve("test_const", {"value": 3})(samples(2)) == [3, 3]
        with pytest.raises(ValueError, match="already registered"):
            rewards.register("test_const")(lambda b: b)
    finally:
        rewards.REGISTRY.pop("test_len_plus")
        rewards.REGISTRY.pop("test_const")


def test_resolution_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown reward 'nope'.*format"):
        rewards.resolve("nope")
    with pytest.raises(ValueError, match="does not exist"):
        rewards.resolve(str(tmp_path / "missing.py") + ":f")
    with pytest.raises(ValueError, match="has no attribute"):
        rewards.resolve("rewards.sample:nothing_here")
    with pytest.raises(ValueError, match="cannot import module"):
        rewards.resolve("no_such_module_xyz:f")


def test_example_user_reward_file(repo_root):
    fn = rewards.resolve(f"{repo_root}/examples/my_reward.py:small_numbers", {"scale": 8})
    out = fn([Sample("p", "0 0"), Sample("p", "4 4"), Sample("p", "no digits"), Sample("p", "9")])
    assert out == [1.0, 0.5, None, 0.0]


def test_a_failure_is_logged_once_per_reward_and_error_type_with_what_failed(caplog):
    """The first failure of each (reward, error type) is logged with the label, the sample, the error's
    type and message; a second error type of the same reward, or another reward, logs again; a batch-level
    failure without a sample id says 'a sample'."""
    def kinds(batch):
        for s in batch:
            if s.output == "1":
                raise ValueError("bad one")
            if s.output == "2":
                raise KeyError("missing")
        return [1.0] * len(batch)

    rs = RewardSet(parse_specs([{"name": f"{__file__}:odd_fails", "label": "odd", "max_fail_frac": 1.0}]))
    rs.fns.append(kinds)
    rs.specs.append(parse_specs([{"name": "format", "label": "kinds", "max_fail_frac": 1.0}])[0])
    with caplog.at_level("WARNING", logger="mmrl.rewards"):
        rs.score(samples(4))
        rs.score(samples(4))
    lines = sorted(r.getMessage() for r in caplog.records)                  # the rewards run concurrently
    assert lines == [
        "reward 'kinds' failed on sample 1: ValueError: bad one (further ValueError errors of this reward are "
        "counted, not logged)",
        "reward 'kinds' failed on sample 2: KeyError: 'missing' (further KeyError errors of this reward are "
        "counted, not logged)",
        "reward 'odd' failed on sample 1: ValueError: cannot score 1 (further ValueError errors of this reward "
        "are counted, not logged)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="mmrl.rewards"):
        rs._note(rs.specs[0], TimeoutError("slow"), "")
    assert [r.getMessage() for r in caplog.records] == [
        "reward 'odd' failed on a sample: TimeoutError: slow (further TimeoutError errors of this reward are "
        "counted, not logged)"]


def nones(batch):
    return [None] * len(batch)


def test_failure_messages_say_what_failed(caplog):
    """A timeout is logged naming the batch's first sample; a reward that only returns None stops with no
    'first error' clause; a per-sample retry that returns the wrong length still stops training."""
    rs = RewardSet(parse_specs([{"name": f"{__file__}:slow", "timeout_s": 0.2, "max_fail_frac": 1.0}]))
    with caplog.at_level("WARNING", logger="mmrl.rewards"):
        rs.score(samples(2))
    assert [r.getMessage() for r in caplog.records] == [
        "reward 'slow' failed on sample 0: TimeoutError: reward 'slow' took longer than timeout_s=0.2 (further "
        "TimeoutError errors of this reward are counted, not logged)"]
    with pytest.raises(RewardError) as err:
        RewardSet(parse_specs([{"name": f"{__file__}:nones"}])).score(samples(2))
    assert str(err.value) == "reward 'nones' failed on 2 of 2 samples (more than max_fail_frac=0.5)"

    def batch_fails_then_too_many(batch):
        if len(batch) > 1:
            raise ValueError("batch")
        return [1.0, 2.0]

    rs = RewardSet(parse_specs([{"name": "format", "label": "retry"}]))
    rs.fns[0] = batch_fails_then_too_many
    with pytest.raises(RewardError, match="^reward 'retry' returned 2 scores for 1 samples"):
        rs.score(samples(2))


def test_scores_are_fp32_whatever_the_default_dtype():
    import torch

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        scores, _ = RewardSet(parse_specs([{"name": f"{__file__}:odd_fails", "max_fail_frac": 1.0}])).score(samples(3))
    finally:
        torch.set_default_dtype(default)
    assert scores.dtype == torch.float32 and scores.shape == (3, 1)


def scaled(batch, factor=1.0):
    return [factor] * len(batch)


def test_reward_keyword_arguments_reach_the_reward():
    """Keys of a `rewards:` entry that are not reserved are the reward's keyword arguments."""
    scores, _ = RewardSet(parse_specs([{"name": f"{__file__}:scaled", "factor": 3.0}])).score(samples(2))
    assert scores[:, 0].tolist() == [3.0, 3.0]


def test_rewards_of_a_batch_run_concurrently_the_first_on_the_calling_thread():
    """Two rewards that each wait for the other (a barrier of 2) only finish when they run at the same
    time; the first configured reward runs on the calling thread (math-verify's timeouts need the main
    thread); each reward's wall time is reported."""
    import threading

    barrier, threads = threading.Barrier(2), {}

    def waits(label):
        def reward(batch):
            threads[label] = threading.current_thread()
            barrier.wait(timeout=30)                                          # BrokenBarrierError if alone
            time.sleep(0.05)
            return [1.0] * len(batch)
        return reward

    rs = RewardSet(parse_specs([{"name": "format", "label": "a"}, {"name": "format", "label": "b"}]))
    rs.fns = [waits("a"), waits("b")]
    scores, metrics = rs.score(samples(3))
    assert scores.tolist() == [[1.0, 1.0]] * 3
    assert threads["a"] is threading.main_thread() and threads["b"] is not threading.main_thread()
    assert metrics["time/reward/a_s"] >= 0.05 and metrics["time/reward/b_s"] >= 0.05
    again, _ = rs.score(samples(2))                                           # the worker thread is reused
    assert again.tolist() == [[1.0, 1.0]] * 2
