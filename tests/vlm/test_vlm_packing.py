"""Padding-free scoring (vlm/packing.py): packed log-probs and gradients equal the padded forward, a row's
log-probs do not depend on the rows packed beside it, attention never crosses a row boundary."""

from __future__ import annotations

import pytest
import torch

from mmrl.types import PromptBatch
from vlm import packing


def _rollout(policy, counting_rows, group=3):
    long_row = dict(counting_rows[1], prompt=counting_rows[1]["prompt"] + " Explain every step." * 3)
    ro = policy.rollout(PromptBatch(rows=[counting_rows[0], long_row], index=[0, 1], seeds=[5, 6], step=0),
                        group_size=group)
    for i, k in ((0, 3), (4, 1)):                        # completions of several lengths
        ro.state["completion"][i] = ro.state["completion"][i][:k]
        ro.mask[i, k:] = 0
    return ro


def _scores(policy, ro, index, pack):
    policy.scorer.pack = pack
    policy.p.model.hf.zero_grad(set_to_none=True)
    scores = policy.log_probs(ro, index)
    (scores.log_probs.sum() + 0.1 * scores.entropy.sum()).backward()
    return scores, {n: p.grad.clone() for n, p in policy.p.model.hf.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_packed_log_probs_and_gradients_equal_the_padded_forward(make_policy, counting_rows, family, monkeypatch,
                                                                 assert_same_scores):
    policy = make_policy(family, lora_rank=0, max_new_tokens=8, share_prefix_scoring=False)
    ro = _rollout(policy, counting_rows)
    segments = []
    inner = packing.sdpa_attention_forward
    monkeypatch.setattr(packing, "sdpa_attention_forward",
                        lambda module, q, *a, **k: (segments.append(q.shape[2]), inner(module, q, *a, **k))[1])
    index = torch.tensor([5, 0, 2, 3])
    packed, g_packed = _scores(policy, ro, index, pack=True)
    layers = policy.p.model.hf.config.get_text_config().num_hidden_layers
    real = [int(ro.state["prompt"][i].input_ids.numel() + ro.state["completion"][i].numel()) for i in index.tolist()]
    assert segments == real * layers                      # one causal attention per row and layer, no padding
    segments.clear()
    padded, g_padded = _scores(policy, ro, index, pack=False)
    assert not segments
    assert_same_scores(packed, g_packed, padded, g_padded, ro.mask[index])


def test_a_row_scores_the_same_whatever_is_packed_beside_it(make_policy, counting_rows):
    """The rollout-time scores (all rows in one pack) equal every microbatch's, bit for bit."""
    policy = make_policy("qwen2_5_vl", max_new_tokens=5, share_prefix_scoring=False)
    ro = policy.rollout(PromptBatch(rows=counting_rows[:3], index=[0, 1, 2], seeds=[1, 2, 3], step=0), group_size=2)
    assert policy.scorer.packs()
    for idx in (torch.tensor([0]), torch.tensor([5, 1]), torch.tensor([3, 4, 0, 2])):
        assert torch.equal(policy.log_probs(ro, idx).log_probs.detach(), ro.log_probs[idx])


def test_packing_leaves_the_attention_setting_as_it_was(make_policy, counting_rows):
    policy = make_policy("llava", max_new_tokens=4, share_prefix_scoring=False)
    text = policy.p.model.hf.config.get_text_config()
    before = text._attn_implementation
    with packing.segment_attention(policy.p.model.hf):
        assert text._attn_implementation == packing.ATTENTION
    assert text._attn_implementation == before
    text._attn_implementation = "flash_attention_2"       # transformers' varlen kernels read the boundaries
    with packing.segment_attention(policy.p.model.hf):
        assert text._attn_implementation == "flash_attention_2"
    text._attn_implementation = before


def test_shared_prefix_wins_over_packing_and_packing_can_be_turned_off(make_policy):
    assert not make_policy("llava").scorer.packs()                       # prefixes shared: nothing to pack
    assert make_policy("llava", share_prefix_scoring=False).scorer.packs()
    assert not make_policy("llava", share_prefix_scoring=False, pack_sequences=False).scorer.packs()

