"""Shared prompt prefix (vlm/prefix.py): generation equals `generate` token for token, log-probs and
gradients equal the unshared forward, the prefix really runs once per prompt, the on-policy ratio stays
exactly 1, and models whose positions are not verified keep the unshared path."""

from __future__ import annotations

import pytest
import torch

from mmrl.types import PromptBatch, concat, select
from vlm import prefix
from vlm.generation import SamplingSpec


def _batch(rows, step=0, seed=1234):
    return PromptBatch(rows=rows, index=list(range(len(rows))), seeds=[seed + i for i in range(len(rows))], step=step)


def _rows(counting_rows):
    """Two prompts of different lengths, so the unshared layout left-pads one of them."""
    long_row = dict(counting_rows[1], prompt=counting_rows[1]["prompt"] + " Explain every step." * 3)
    return [counting_rows[0], long_row]


def _sample(policy, items, group, spec, seeds, shared):
    """(completions, ended) and how many times HF generate ran; greedy: each prompt's rows in its own call."""
    backend = policy.p.backend
    backend.share_prefix = shared
    calls = []
    hook = policy.p.model.hf.generate
    policy.p.model.hf.generate = lambda *a, **k: (calls.append(1), hook(*a, **k))[1]
    try:
        if spec.greedy and group > 1:
            out = [r for x in items for r in backend.sample_rows([x] * group, spec, None, "cpu")]
            out = ([c for c, _ in out], [e for _, e in out])
        else:
            out = backend.sample(items, group, spec, seeds, "cpu")
    finally:
        del policy.p.model.hf.generate
    return out, len(calls)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
@pytest.mark.parametrize("greedy", [False, True])
def test_shared_prefix_generation_equals_generate_token_for_token(make_policy, counting_rows, family, greedy):
    policy = make_policy(family, max_new_tokens=10)
    items = policy._prompts(_batch(_rows(counting_rows)))
    spec = SamplingSpec(10, greedy=True) if greedy else SamplingSpec(10, temperature=1.3, top_k=50)
    for seeds, rows_per_call in (([1, 2], 0), ([77, 5], 0), ([77, 5], 8)):   # 8: both prompts in one call
        policy.p.backend.rows_per_call = rows_per_call
        (plain, ended_plain), n_generate = _sample(policy, items, 4, spec, seeds, shared=False)
        (shared, ended_shared), n_shared = _sample(policy, items, 4, spec, seeds, shared=True)
        assert n_generate > 0 and n_shared == 0          # the shared path does not call generate
        assert [c.tolist() for c in shared] == [c.tolist() for c in plain]
        assert ended_shared == ended_plain
    if not greedy:                                       # sampling: the rows of a prompt really differ
        assert len({tuple(c.tolist()) for c in plain[:4]}) > 1


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_greedy_evaluation_of_prompts_of_several_lengths_in_one_call(make_policy, counting_rows, family):
    """Evaluation decodes every prompt in one left-padded call: prefilled once each, same tokens."""
    policy = make_policy(family, max_new_tokens=12)
    rows = _rows(counting_rows) + counting_rows[2:4]
    items = policy._prompts(_batch(rows))
    assert len({int(x.input_ids.numel()) for x in items}) > 1
    plain, n_generate = _sample(policy, items, 1, SamplingSpec(12, greedy=True), None, shared=False)
    policy.p.backend.share_prefix = True
    shared = policy.p.backend.sample(items, 1, SamplingSpec(12, greedy=True), None, "cpu")
    assert n_generate == 1
    assert [c.tolist() for c in shared[0]] == [c.tolist() for c in plain[0]] and shared[1] == plain[1]
    assert len({tuple(c.tolist()) for c in shared[0]}) > 1


def _scores(policy, ro, index, shared, grad=False):
    policy.scorer.share_prefix = shared
    policy.p.model.hf.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad):
        scores = policy.log_probs(ro, index)
    if grad:
        (scores.log_probs.sum() + 0.1 * scores.entropy.sum()).backward()
        return scores, {n: p.grad.clone() for n, p in policy.p.model.hf.named_parameters() if p.grad is not None}
    return scores, None


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_shared_prefix_log_probs_and_gradients_equal_the_unshared_forward(make_policy, counting_rows, family,
                                                                           assert_same_scores):
    """fp32, images, prompts of two lengths, completions of several lengths, full fine-tuning."""
    policy = make_policy(family, lora_rank=0, max_new_tokens=8)
    ro = policy.rollout(_batch(_rows(counting_rows)), group_size=3)
    for i, k in ((0, 3), (4, 1), (5, 6)):                # a prefix of a completion is a valid completion
        ro.state["completion"][i] = ro.state["completion"][i][:k]
        ro.mask[i, k:] = 0
    index = torch.tensor([5, 0, 2, 3])                    # rows of both prompts, out of order
    plain, g_plain = _scores(policy, ro, index, shared=False, grad=True)
    shared, g_shared = _scores(policy, ro, index, shared=True, grad=True)
    assert_same_scores(shared, g_shared, plain, g_plain, ro.mask[index])


def test_the_prefix_runs_once_per_prompt_per_forward(make_policy, counting_rows):
    """Rows of 2 prompts x 3 samples: the language model sees each prompt once (batch 1), then the
    completions of that prompt; unshared it would see every prompt 3 times."""
    policy = make_policy("qwen2_5_vl", max_new_tokens=6)
    ro = policy.rollout(_batch(_rows(counting_rows)), group_size=3)
    seen = []
    lm = policy.p.model.hf.model.language_model
    handle = lm.register_forward_hook(lambda m, args, kw, out: seen.append(tuple(kw["inputs_embeds"].shape[:2])),
                                      with_kwargs=True)
    try:
        _scores(policy, ro, torch.arange(6), shared=True, grad=True)
    finally:
        handle.remove()
    lengths = [int(x.input_ids.numel()) for x in ro.state["prompt"][::3]]
    t = ro.mask.shape[1]
    assert seen[0] == (1, lengths[0]) and seen[2] == (1, lengths[1])
    assert seen[1][1] == seen[3][1] == t - 1 and seen[1][0] >= 3      # completions (extra copy rows: MIN_POSITIONS)
    assert len(seen) == 4
    prompt_tokens = sum(b * n for b, n in seen[0::2])
    assert prompt_tokens == sum(lengths)                               # not 3 * sum(lengths)


def test_ratio_is_exactly_one_whatever_rows_share_a_microbatch(make_policy, counting_rows):
    """Rollout-time scoring (all 6 rows) and training microbatches that split the groups give bit-identical
    log-probs on the shared path."""
    policy = make_policy("llava", max_new_tokens=5)
    a = policy.rollout(_batch(_rows(counting_rows)), group_size=3)
    b = policy.rollout(_batch(counting_rows[2:3], step=1), group_size=2)
    both = concat([a, select(b, torch.tensor([1]))])
    assert policy.scorer.shares_prefix()
    for idx in (torch.tensor([0]), torch.tensor([4, 1, 6]), torch.tensor([2, 3, 5, 0]), torch.arange(len(both))):
        got = policy.log_probs(both, idx).log_probs.detach()
        assert torch.equal(got, both.log_probs[idx])


def test_three_dimensional_positions_are_what_makes_qwen_right(make_policy, counting_rows, monkeypatch):
    """Qwen2.5-VL's text after an image sits at 3-D position L + k + delta, delta < 0 here: continuing
    at the 1-D position L + k (what a plain KV-cache continuation does) gives other log-probs."""
    policy = make_policy("qwen2_5_vl", max_new_tokens=6)
    ro = policy.rollout(_batch(counting_rows[:1]), group_size=2)
    items = ro.state["prompt"]
    batch = prefix.prefix_batch(items[0], policy.p.tokens.pad_id, policy.p.tokens.image_token_id, "cpu")
    assert prefix.rope_delta(policy.p.model.hf, batch) < 0
    right, _ = _scores(policy, ro, torch.arange(2), shared=True)
    monkeypatch.setitem(prefix.VERIFIED, "qwen2_5_vl", "1d")
    wrong, _ = _scores(policy, ro, torch.arange(2), shared=True)
    torch.testing.assert_close(right.log_probs, ro.log_probs, atol=1e-5, rtol=0)
    assert float((wrong.log_probs - ro.log_probs).abs().max()) > 1e-3


def test_unverified_models_and_checkpointing_keep_the_unshared_path(make_policy, counting_rows, monkeypatch):
    policy = make_policy("llava", max_new_tokens=4)
    hf = policy.p.model.hf
    assert prefix.reason_unshared(hf) is None and policy.scorer.shares_prefix()
    monkeypatch.delitem(prefix.VERIFIED, "llava")
    assert "model type 'llava' is not one of the verified" in prefix.reason_unshared(hf)
    assert not policy.scorer.shares_prefix()
    items = policy._prompts(_batch(counting_rows[:1]))
    _, n_generate = _sample(policy, items, 2, SamplingSpec(4), [3], shared=True)
    assert n_generate == 1                                                  # generate, not the shared decode
    monkeypatch.setitem(prefix.VERIFIED, "llava", "1d")
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert "gradient checkpointing" in prefix.reason_unshared(hf, training=True)
    assert prefix.reason_unshared(hf) is None                               # generation runs in eval mode
    assert not policy.scorer.shares_prefix()
    policy.scorer.share_prefix = False
    assert not policy.scorer.packs()        # backward's recomputation would run outside the segment attention


def test_settings_turn_each_part_off(make_policy):
    policy = make_policy("llava", share_prefix_generation=False, share_prefix_scoring=False)
    assert not policy.p.backend.share_prefix and not policy.scorer.shares_prefix()
    policy = make_policy("llava")
    assert policy.p.backend.share_prefix and policy.scorer.shares_prefix()
