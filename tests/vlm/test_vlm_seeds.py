"""Per-prompt randomness of the VLM adapter: what prompt i samples depends on `PromptBatch.seeds[i]`
(and the sample index) only, not on the other prompts of the rollout nor on `generate_rows_per_call`."""

from __future__ import annotations

import pytest
import torch

from mmrl.types import PromptBatch
from vlm.generation import SeededSampler, generate_calls, sample_seed

G = 4


def _rollout(make_policy, rows, seeds, rows_per_call, family="qwen2_5_vl"):
    policy = make_policy(family, max_new_tokens=6, generate_rows_per_call=rows_per_call)
    batch = PromptBatch(rows=rows, index=list(range(len(rows))), seeds=seeds, step=3)
    return policy.rollout(batch, group_size=G)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_a_prompt_samples_the_same_alone_or_beside_others(make_policy, counting_rows, family):
    a, b = counting_rows[:2]
    both = _rollout(make_policy, [a, b], [11, 12], 0, family)
    alone = _rollout(make_policy, [b], [12], 3, family)              # other prompts, other call chunking
    split = _rollout(make_policy, [b, a], [12, 11], 1, family)       # b first, one row per call
    for other in (alone, split):
        got = other.state["completion"][:G]
        assert len(both.state["completion"]) == 2 * G and len(got) == G
        assert all(torch.equal(x, y) for x, y in zip(both.state["completion"][G:], got, strict=True))
    texts = [s.output for s in both.samples[G:]]
    assert len(set(texts)) > 1                                       # the G samples of a prompt differ


def test_the_prompt_seed_drives_the_samples(make_policy, counting_rows):
    b = counting_rows[1]
    one, other = (_rollout(make_policy, [b], [s], 0).state["completion"] for s in (12, 13))
    assert len(one) == len(other) == G
    assert not all(torch.equal(x, y) for x, y in zip(one, other, strict=True))


def test_rollout_leaves_the_global_rng_alone(make_policy, counting_rows):
    policy = make_policy("qwen2_5_vl", max_new_tokens=4)
    before = torch.get_rng_state()
    policy.rollout(PromptBatch(rows=counting_rows[:1], index=[0], seeds=[5], step=0), group_size=2)
    assert torch.equal(before, torch.get_rng_state())


def test_generate_calls_keep_prompts_apart_unless_whole_groups_fit():
    assert generate_calls(2, 4, 0) == [[(0, 0), (0, 1), (0, 2), (0, 3)], [(1, 0), (1, 1), (1, 2), (1, 3)]]
    assert generate_calls(1, 4, 3) == [[(0, 0), (0, 1), (0, 2)], [(0, 3)]]
    assert generate_calls(3, 2, 5) == [[(0, 0), (0, 1), (1, 0), (1, 1)], [(2, 0), (2, 1)]]


def test_sample_seeds_are_distinct_across_neighbouring_prompts():
    seeds = {sample_seed(s, j) for s in range(100, 140) for j in range(16)}
    assert len(seeds) == 40 * 16


def test_seeded_sampler_draws_from_the_softmax_and_never_a_blocked_token():
    """Inverse-CDF draws of 4000 rows (one generator each) follow softmax(scores); -inf stays unreachable."""
    scores = torch.tensor([[0.0, 1.0, -float("inf"), 2.0, -1.0]]).repeat(4000, 1)          # [B, V]
    gens = [torch.Generator().manual_seed(sample_seed(7, j)) for j in range(4000)]
    out = SeededSampler(gens)(None, scores)                                                 # [B, V]
    assert bool((out.isfinite().sum(1) == 1).all())
    tokens = out.argmax(1)
    freq = torch.bincount(tokens, minlength=5).float() / 4000
    assert freq[2] == 0
    torch.testing.assert_close(freq, torch.softmax(scores[0], -1), atol=0.03, rtol=0)
    again = SeededSampler([torch.Generator().manual_seed(sample_seed(7, j)) for j in range(3)])(None, scores[:3])
    assert torch.equal(again, out[:3])                                                      # a row's draw is its own
