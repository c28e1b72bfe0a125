"""Placeholder tokens are never generated, and the image-token invariant is checked with a clear error."""

from __future__ import annotations

import pytest
import torch

from mmrl.config import ConfigError
from mmrl.types import PromptBatch


def _batch(rows):
    return PromptBatch(rows=rows, index=list(range(len(rows))), seeds=[7] * len(rows), step=0)


def _favour(policy, token_id: int, boost: float = 40.0):
    """Make the model strongly prefer `token_id` (a drifting policy that wants to emit it)."""
    def hook(module, args, out):
        out = out.clone()
        out[..., token_id] += boost
        return out

    return policy.p.model.hf.get_output_embeddings().register_forward_hook(hook)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_image_placeholder_is_never_generated(make_policy, counting_rows, family):
    from vlm.batch import collate, layout_for

    policy = make_policy(family, max_new_tokens=6)
    m, tk = policy.p.model, policy.p.tokens
    assert tk.image_token_id in tk.blocked
    _favour(policy, tk.image_token_id)
    # without the block the model emits the placeholder (what the block prevents)
    items = policy._prompts(_batch(counting_rows[:1]))
    batch = collate(items, None, layout_for(items, None), tk.pad_id, tk.image_token_id, "cpu")
    raw = m.hf.generate(**batch, do_sample=True, max_new_tokens=6, pad_token_id=tk.pad_id)
    assert (raw[:, batch["input_ids"].shape[1]:] == tk.image_token_id).any()
    # the rollout never does, and re-scoring works
    ro = policy.rollout(_batch(counting_rows[:2]), group_size=3)
    comps = ro.state["completion"]
    assert all(not torch.isin(c, torch.tensor(tk.blocked)).any() for c in comps)
    assert torch.isfinite(ro.log_probs).all()
    assert torch.equal(policy.log_probs(ro, torch.arange(len(ro))).log_probs.detach(), ro.log_probs)


def test_blocked_set_covers_special_tokens_but_not_eos(make_policy):
    policy = make_policy("qwen2_5_vl")
    tok, blocked = policy.p.model.tokenizer, set(policy.p.tokens.blocked)
    for name in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_start|>"):
        assert tok.convert_tokens_to_ids(name) in blocked
    assert not blocked & set(policy.p.tokens.stop_ids)
    assert tok.convert_tokens_to_ids("<answer>") not in blocked      # R1 tags stay generatable
    other = make_policy("qwen2_5_vl", allowed_special_tokens=["<|im_start|>"])
    assert tok.convert_tokens_to_ids("<|im_start|>") not in other.p.tokens.blocked
    with pytest.raises(ValueError, match="allowed_special_tokens.*image/video token"):
        make_policy("qwen2_5_vl", allowed_special_tokens=["<|image_pad|>"])


def test_batch_with_a_placeholder_in_a_completion_fails_clearly(make_policy, counting_rows):
    from vlm.batch import layout_for

    policy = make_policy("qwen2_5_vl")
    items = policy._prompts(_batch(counting_rows[:2]))
    comps = [torch.tensor([40, 41]), torch.tensor([40, policy.p.tokens.image_token_id, 41])]
    layout = layout_for(items, comps)
    with pytest.raises(ConfigError, match=r"image placeholder tokens in the batch \(\d+\) != image features .*row 1"):
        policy.scorer(items, comps, [layout] * 2, 3)


def test_prompt_with_too_few_placeholders_fails_clearly(make_policy, counting_rows):
    from vlm.prompts import check_image_tokens

    policy = make_policy("qwen2_5_vl")
    item = policy._prompts(_batch(counting_rows[:1]))[0]
    keep = torch.ones_like(item.input_ids, dtype=torch.bool)
    keep[int((item.input_ids == policy.p.tokens.image_token_id).nonzero()[0])] = False
    item.input_ids = item.input_ids[keep]                     # as a careless truncation would
    with pytest.raises(ConfigError, match=r"data.train, row 0: image placeholder tokens in the prompt \(3\) != image features \(4\)"):
        check_image_tokens(item, policy.p.tokens.image_token_id)


def test_truncation_keeps_every_image_token(make_policy, counting_rows):
    long_row = dict(counting_rows[0], prompt="Look closely. " * 40 + counting_rows[0]["prompt"])
    strict = make_policy("qwen2_5_vl", max_prompt_tokens=120)
    with pytest.raises(ConfigError, match=r"data.train, row 0: the prompt has \d+ tokens .*policy.truncation=left"):
        strict._prompts(_batch([long_row]))
    policy = make_policy("qwen2_5_vl", max_prompt_tokens=120, truncation="left")
    item = policy._prompts(_batch([long_row]))[0]
    assert item.truncated and item.input_ids.numel() == 120
    assert int((item.input_ids == policy.p.tokens.image_token_id).sum()) == 4
    assert item.token_inputs["mm_token_type_ids"].numel() == 120
    ro = policy.rollout(_batch([long_row]), group_size=2)
    assert ro.samples[0].meta["prompt_truncated"] is True
