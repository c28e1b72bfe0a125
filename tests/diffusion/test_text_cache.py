"""The text-embedding cache (diffusion/text_cache.py): exact, LRU-bounded, off at size 0, emptied when the
text encoders' weights change, and invisible in rollouts; and the fixed-size VAE decode chunks."""

import numpy as np
import pytest
import torch

from diffusion.families.common import Cond
from diffusion.policy import validate
from diffusion.text_cache import TextCache

TEXTS = ["a red circle", "a blue square"]


def _counting_encoder(calls: list):
    def encode(prompt: str) -> Cond:
        calls.append(prompt)
        return Cond(prompt, {"embeds": torch.full((2, 3), float(len(calls)))})
    return encode


def _encoder_rows(policy) -> list:
    """Rows each text encoder of `policy` is given from now on (one list shared by all encoders)."""
    rows = []
    for m in policy.family.text_encoders():
        forward = m.forward

        def counted(input_ids=None, *args, _forward=forward, **kwargs):
            rows.append(input_ids.shape[0])
            return _forward(input_ids, *args, **kwargs)
        m.forward = counted
    return rows


def test_cached_embeddings_equal_fresh_ones_bit_for_bit(build_tiny):
    policy = build_tiny("sd3")
    first = policy.encode(TEXTS)
    again = policy.encode(TEXTS[::-1])
    for p in TEXTS:
        fresh = policy.family.encode([p])[0]
        assert again[p] is first[p]                                        # served from the cache
        assert all(torch.equal(first[p].tensors[k], fresh.tensors[k]) for k in fresh.tensors)


def test_a_repeated_prompt_is_not_encoded_again(build_tiny, prompts):
    policy = build_tiny("sd3")
    rows = _encoder_rows(policy)
    policy.rollout(prompts(TEXTS), group_size=2)
    assert rows == [1] * 3 * len(TEXTS)                                    # 3 encoders, each prompt alone
    policy.rollout(prompts(TEXTS[1:] + ["a green triangle"]), group_size=2)
    assert rows == [1] * 3 * (len(TEXTS) + 1)                             # only the new prompt
    policy.generate_eval(prompts(TEXTS, step=-1))
    assert len(rows) == 3 * (len(TEXTS) + 1)


def test_lru_evicts_the_least_recently_used():
    calls = []
    cache = TextCache(_counting_encoder(calls), size=2)
    cache.get(["a", "b"])
    cache.get(["a"])                                                       # a used again: b is now the oldest
    cache.get(["c"])                                                       # evicts b
    assert len(cache) == 2 and calls == ["a", "b", "c"]
    cache.get(["a", "c"])
    assert calls == ["a", "b", "c"]
    cache.get(["b"])                                                       # re-encoded, evicts a
    assert calls == ["a", "b", "c", "b"]
    cache.get(["c"])
    cache.get(["a"])
    assert calls == ["a", "b", "c", "b", "a"]


def test_size_zero_disables_the_cache(build_tiny, prompts):
    calls = []
    cache = TextCache(_counting_encoder(calls), size=0)
    cache.get(["a", "a", "b"])                                             # within one call, each prompt once
    cache.get(["a"])
    assert calls == ["a", "b", "a"] and len(cache) == 0
    policy = build_tiny("sd3", "text_cache_size=0")
    rows = _encoder_rows(policy)
    for _ in range(2):
        policy.rollout(prompts(TEXTS), group_size=2)
    assert len(rows) == 2 * 3 * len(TEXTS)


def _pixels(rollout) -> list:
    return [np.asarray(s.output) for s in rollout.samples]


def test_rollouts_with_the_cache_equal_rollouts_without_it(build_tiny, prompts):
    cached, plain = build_tiny("sd3"), build_tiny("sd3", "text_cache_size=0")
    for step in range(2):                                                  # cold, then warm
        a = cached.rollout(prompts(TEXTS, seeds=[5, 6], step=step), group_size=2)
        b = plain.rollout(prompts(TEXTS, seeds=[5, 6], step=step), group_size=2)
        assert torch.equal(a.log_probs, b.log_probs) and torch.equal(a.state["latents"], b.state["latents"])
        assert all(np.array_equal(x, y) for x, y in zip(_pixels(a), _pixels(b), strict=True))
    assert len(cached.text_cache) == len(TEXTS) and len(plain.text_cache) == 0


def test_changed_encoder_weights_empty_the_cache(build_tiny):
    policy = build_tiny("sd3")
    old = policy.encode(TEXTS[:1])[TEXTS[0]]
    with torch.no_grad():
        next(policy.family.pipe.text_encoder_3.parameters()).mul_(1.5)     # e.g. load_state_dict, an optimizer step
    new = policy.encode(TEXTS[:1])[TEXTS[0]]
    assert new is not old and not torch.equal(new.tensors["embeds"], old.tensors["embeds"])
    assert torch.equal(new.tensors["embeds"], policy.family.encode(TEXTS[:1])[0].tensors["embeds"])


def test_writing_into_a_cached_embedding_is_caught():
    cache = TextCache(_counting_encoder([]), size=4)
    cache.get(["a"])["a"].tensors["embeds"].add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place"):
        cache.get(["a"])


@pytest.mark.parametrize("override,key", [("text_cache_size=-1", "policy.text_cache_size"),
                                          ("decode_batch=-2", "policy.decode_batch")])
def test_sizes_are_checked_at_load(override, key, policy_config):
    with pytest.raises(ValueError, match=key):
        validate(policy_config("sd3", override))


def _decode_calls(policy) -> list:
    """Rows of each VAE decode call of `policy` from now on."""
    fam, rows = policy.family, []
    decode = fam.decode
    fam.decode = lambda z: rows.append(z.shape[0]) or decode(z)
    return rows


def test_decode_chunks_have_a_fixed_size(build_tiny):
    """decode_batch rows per VAE call, the last one padded, so an image is the same alone or in a batch."""
    policy = build_tiny("sd3", "decode_batch=3", "forward_batch=8")
    calls = _decode_calls(policy)
    x = policy.family.noise(5, torch.Generator().manual_seed(0))          # [5, ...]
    many, alone = policy._decode(x), policy._decode(x[4:5])
    assert calls == [3, 3, 3] and len(many) == 5 and len(alone) == 1
    assert np.array_equal(np.asarray(many[4]), np.asarray(alone[0]))
    default = build_tiny("sd3", "forward_batch=4")                        # decode_batch 0 = forward_batch
    calls = _decode_calls(default)
    default._decode(x)
    assert calls == [4, 4]
