"""Rollout select/concat/group_size; PromptSampler; load_records."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmrl.config import ConfigError
from mmrl.data import PromptSampler, load_records
from mmrl.types import Rollout, concat, select


def rollout(n, t, groups, tag, d=2):
    """n samples, T = t; log_probs[i, j] = tag + i + j / 10, mask all ones."""
    lp = torch.tensor([[tag + i + j / 10 for j in range(t)] for i in range(n)])
    return Rollout(
        samples=[f"{tag}-{i}" for i in range(n)],
        log_probs=lp,
        mask=torch.ones(n, t),
        group=torch.tensor(groups, dtype=torch.long),
        state={"lat": torch.ones(n, t, d) * tag,   # [N, T, D]
               "act": torch.full((n, t), 7),       # [N, T] long
               "ctx": torch.arange(n) + tag,       # [N]
               "names": [f"n{tag}-{i}" for i in range(n)]},
    )


# ---------------------------------------------------------------- select / concat

def test_select_takes_rows_everywhere():
    r = rollout(4, 3, [0, 0, 1, 1], 10)
    s = select(r, torch.tensor([2, 3, 0]))
    assert s.samples == ["10-2", "10-3", "10-0"]
    torch.testing.assert_close(s.log_probs, r.log_probs[[2, 3, 0]])
    assert s.group.tolist() == [1, 1, 0]
    assert s.state["ctx"].tolist() == [12, 13, 10]
    assert s.state["names"] == ["n10-2", "n10-3", "n10-0"]
    assert s.state["lat"].shape == (3, 3, 2)
    assert len(s) == 3
    empty = select(r, torch.tensor([], dtype=torch.long))
    assert len(empty) == 0 and empty.samples == [] and empty.state["names"] == []


def test_concat_renumbers_groups_and_pads_right_with_zeros():
    a = rollout(2, 2, [0, 0], 10)          # T = 2
    b = rollout(4, 3, [0, 0, 1, 1], 20)    # T = 3
    c = concat([a, b])
    assert c.group.tolist() == [0, 0, 1, 1, 2, 2]
    assert c.samples == ["10-0", "10-1", "20-0", "20-1", "20-2", "20-3"]
    assert c.log_probs.shape == (6, 3) and c.mask.shape == (6, 3)
    torch.testing.assert_close(c.log_probs[:2], torch.tensor([[10.0, 10.1, 0.0], [11.0, 11.1, 0.0]]))
    torch.testing.assert_close(c.log_probs[2:], b.log_probs)
    assert c.mask.tolist() == [[1, 1, 0], [1, 1, 0]] + [[1, 1, 1]] * 4
    # [N, T, D] state: padded along T only
    assert c.state["lat"].shape == (6, 3, 2)
    assert c.state["lat"][:2, :2].eq(10).all() and c.state["lat"][:2, 2].eq(0).all()
    assert c.state["lat"][2:].eq(20).all()
    assert c.state["act"].dtype == torch.long and c.state["act"].tolist()[:2] == [[7, 7, 0], [7, 7, 0]]
    # [N] state: concatenated; list state: joined
    assert c.state["ctx"].tolist() == [10, 11, 20, 21, 22, 23]
    assert c.state["names"] == ["n10-0", "n10-1", "n20-0", "n20-1", "n20-2", "n20-3"]
    assert c.group_size == 2


def test_concat_keeps_groups_distinct_after_select_and_with_empty_parts():
    a = select(rollout(6, 2, [0, 0, 1, 1, 2, 2], 10), torch.tensor([2, 3]))   # group [1, 1]
    empty = select(rollout(2, 2, [0, 0], 30), torch.tensor([], dtype=torch.long))
    b = rollout(2, 2, [0, 0], 20)
    c = concat([a, empty, b])
    g = c.group.tolist()
    assert len(c) == 4 and g[0] == g[1] and g[2] == g[3] and g[0] != g[2]
    assert c.samples == ["10-2", "10-3", "20-0", "20-1"]


def test_group_size():
    assert rollout(6, 1, [0, 0, 0, 1, 1, 1], 0).group_size == 3
    with pytest.raises(ValueError, match=r"unequal sizes \[2, 1\]"):
        rollout(3, 1, [0, 0, 1], 0).group_size
    with pytest.raises(ValueError, match="unequal sizes"):
        rollout(0, 1, [], 0).group_size


def test_group_size_after_selecting_later_groups():
    # select keeps the original group ids: kept groups 1 and 3 of a filtered step, 2 samples each.
    # Every present group has 2 samples, so group_size should be 2.
    r = rollout(8, 1, [0, 0, 1, 1, 2, 2, 3, 3], 0)
    s = select(r, torch.tensor([2, 3, 6, 7]))
    assert s.group.tolist() == [1, 1, 3, 3]
    assert s.group_size == 2


# ---------------------------------------------------------------- PromptSampler

def test_sampler_covers_each_index_once_per_epoch():
    s = PromptSampler(size=7, seed=3)
    e0, e1, e2 = s.take(7), s.take(7), s.take(7)
    for e in (e0, e1, e2):
        assert sorted(e) == list(range(7))
    assert e0 != e1 and e1 != e2
    assert (s.epoch, s.position) == (3, 0)


def test_sampler_crosses_epoch_boundaries():
    ref = PromptSampler(size=7, seed=3)
    flat = ref.take(14)
    s = PromptSampler(size=7, seed=3)
    assert s.take(5) + s.take(5) + s.take(4) == flat
    assert (s.epoch, s.position) == (2, 0)
    big = PromptSampler(size=3, seed=1).take(10)       # more than an epoch in one call
    assert [sorted(big[i:i + 3]) for i in (0, 3, 6)] == [[0, 1, 2]] * 3 and len(big) == 10


def test_sampler_deterministic_per_seed():
    assert PromptSampler(10, seed=5).take(25) == PromptSampler(10, seed=5).take(25)
    assert PromptSampler(10, seed=5).take(10) != PromptSampler(10, seed=6).take(10)


def test_sampler_resumes_exactly():
    s = PromptSampler(size=9, seed=11)
    s.take(4)
    s.take(7)                                       # epoch 1, position 2
    state = json.loads(json.dumps(s.state_dict()))  # as a checkpoint stores it
    assert state == {"epoch": 1, "position": 2}
    expected = s.take(20)
    resumed = PromptSampler(size=9, seed=11)
    resumed.load_state_dict(state)
    assert resumed.take(20) == expected


@settings(max_examples=30, deadline=None)
@given(size=st.integers(1, 12), seed=st.integers(0, 2**31), takes=st.lists(st.integers(0, 15), max_size=8))
def test_sampler_any_take_pattern_is_the_same_stream(size, seed, takes):
    s = PromptSampler(size, seed)
    got = [i for k in takes for i in s.take(k)]
    flat = PromptSampler(size, seed).take(len(got))
    assert got == flat
    for start in range(0, len(flat) - size + 1, size):
        assert sorted(flat[start:start + size]) == list(range(size))


# ---------------------------------------------------------------- load_records

def test_jsonl_bad_line_names_file_and_line(tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text('{"q": 1}\n\n{"q": 2\n')
    with pytest.raises(ConfigError, match=r"train\.jsonl, line 3: not valid JSON"):
        load_records(str(p))


def test_jsonl_non_object_line(tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text('{"q": 1}\n[1, 2]\n')
    with pytest.raises(ConfigError, match=r"train\.jsonl, line 2: expected a JSON object, got list"):
        load_records(str(p))


def test_jsonl_and_json_read(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"q": 1}\n\n{"q": 2}\n')
    assert load_records(str(p)) == [{"q": 1}, {"q": 2}]
    j = tmp_path / "a.json"
    j.write_text(json.dumps([{"q": 3}]))
    assert load_records(str(j)) == [{"q": 3}]


def test_invalid_json_file_names_the_file(tmp_path):
    # the docstring promises "errors name the file, line or field"; the .jsonl branch does,
    # the .json branch lets a bare json.JSONDecodeError through (no file name, not a ConfigError)
    j = tmp_path / "broken.json"
    j.write_text('[{"q": 1},')
    with pytest.raises(ConfigError, match=r"broken\.json"):
        load_records(str(j))


def test_missing_file_names_the_config_field(tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'data\.eval': file .*nope\.jsonl.* does not exist"):
        load_records(str(tmp_path / "nope.jsonl"), field="data.eval")


def test_empty_source_is_an_error(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n")
    with pytest.raises(ConfigError, match="holds no records"):
        load_records(str(p))


def test_unknown_source_kind(tmp_path):
    with pytest.raises(ConfigError, match=r"config key 'data\.train'.*not a \.jsonl/\.json/\.parquet"):
        load_records("data.csv")


def test_module_function_source():
    rows = load_records("mmrl.testing.bandit:contexts", {"num_contexts": 3, "num_arms": 5, "num_actions": 2})
    assert [r["context"] for r in rows] == [0, 1, 2]
    for r in rows:
        arms = r["answer"].split()
        assert len(arms) == 2 and all(0 <= int(a) < 5 for a in arms)
    assert rows == load_records("mmrl.testing.bandit:contexts", {"num_contexts": 3, "num_arms": 5, "num_actions": 2})


def test_module_function_source_errors():
    with pytest.raises(ConfigError, match="data source"):
        load_records("mmrl.testing.bandit:no_such_function")
    with pytest.raises(ConfigError, match="data source"):
        load_records("mmrl.no_such_module:contexts")
