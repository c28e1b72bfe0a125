"""The VLM policy's contracts on tiny models: exact on-policy ratio, cached vision features,
consistency of the scoring forward with generation, references, weights round trip."""

from __future__ import annotations

import os

import pytest
import torch

from mmrl.config import load_config
from mmrl.types import PromptBatch, concat, select

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIG = os.path.join(ROOT, "configs", "tiny", "vlm_tiny.yaml")


class FirstGroupFlatOnce:
    """Reward factory: the first call gives group 0 no signal (so DAPO dynamic sampling resamples
    and the step's batch mixes two rollout rounds with different layouts); then a hash score."""

    def __init__(self, group_size: int = 4):
        self.calls, self.group_size = 0, group_size

    def __call__(self, samples):
        import hashlib

        self.calls += 1
        scores = [int(hashlib.sha256(f"{s.id}{s.output}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF for s in samples]
        if self.calls == 1:
            scores[:self.group_size] = [0.5] * self.group_size
        return scores


def _batch(rows, step=0):
    return PromptBatch(rows=rows, index=list(range(len(rows))), seeds=[1234 + i for i in range(len(rows))], step=step)


def _read_metrics(out_dir):
    import json

    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


@pytest.mark.parametrize("scoring", ["policy.share_prefix_scoring=true", "policy.share_prefix_scoring=false"])
def test_every_first_epoch_microbatch_has_ratio_exactly_one(tmp_path, scoring):
    """Microbatches of 3 mixing two dynamic-sampling rounds (two layouts), scored with a shared prefix or
    packed: ratio - 1 is exactly 0."""
    from mmrl.loop.trainer import train

    cfg = load_config(CONFIG, [
        f"output_dir={tmp_path}", "max_steps=1", "eval.every=0", "checkpoint.every=0", scoring,
        "policy.old_log_probs=rollout",                   # a separate no-grad scoring pass, other microbatches
        "train.samples_per_microbatch=3", "train.update_epochs=1", "algo.filter.name=dynamic",
        "algo.filter.max_resample_rounds=2", "policy.max_new_tokens=10",
        f"rewards=[{{name: '{os.path.join(HERE, 'test_vlm_policy.py')}:FirstGroupFlatOnce'}}]"])
    train(cfg)
    row = _read_metrics(str(tmp_path))[0]
    assert row["filter/rounds"] == 2
    assert row["ratio/first_max_abs_dev"] == 0.0
    assert row["ratio/max_abs_dev"] == 0.0          # one optimizer step per epoch: all microbatches on-policy


def test_vision_tower_runs_once_per_prompt_per_step(make_policy, counting_rows):
    policy = make_policy("qwen2_5_vl", reference="adapter")
    calls = []
    policy.p.model.hf.model.visual.register_forward_hook(lambda *a: calls.append(1))
    ro = policy.rollout(_batch(counting_rows[:2]), group_size=3)
    assert len(calls) == 2                           # one per prompt, shared by its 3 samples and generation
    for _ in range(2):                               # two update epochs, two microbatches each
        for idx in torch.arange(len(ro)).split(4):
            policy.log_probs(ro, idx).log_probs.sum().backward()
    policy.reference_log_probs(ro, torch.arange(len(ro)))
    assert len(calls) == 2
    assert all(p.grad is None for p in policy.p.model.hf.model.visual.parameters())


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_scoring_forward_matches_generation_logits(make_policy, counting_rows, family):
    """Old log-probs from the predict forward equal log-softmax of generate's own logits on the
    sampled tokens (up to KV-cache rounding): positions, rope and image features line up; past each
    row's end (inside the layout and beyond it) log-probs and entropies are exactly 0."""
    from vlm.batch import collate, layout_for
    from vlm.generation import BlockTokens
    from vlm.logprobs import BLOCK_BIAS

    policy = make_policy(family, max_new_tokens=8)
    items = policy._prompts(_batch(counting_rows[:2]))
    m, tk = policy.p.model, policy.p.tokens
    batch = collate(items, None, layout_for(items, None), tk.pad_id, tk.image_token_id, "cpu")
    torch.manual_seed(0)
    out = m.hf.generate(**batch, do_sample=True, max_new_tokens=8, top_k=0, output_logits=True,
                        return_dict_in_generate=True, eos_token_id=tk.stop_ids, pad_token_id=tk.pad_id,
                        logits_processor=[BlockTokens(tk.blocked)])
    new = out.sequences[:, batch["input_ids"].shape[1]:]                                  # [B, t]
    comps = [new[r, :8] for r in range(len(items))]
    comps = [c[:int((torch.isin(c, torch.tensor(tk.stop_ids))).nonzero()[0]) + 1]
             if torch.isin(c, torch.tensor(tk.stop_ids)).any() else c for c in comps]
    comps[0] = comps[0][:5]       # a prefix is a valid completion; row 0 now ends inside the layout
    layout = layout_for(items, comps)
    out_len = layout.width - layout.prompt_width + 2       # and every row has positions past its end
    with torch.no_grad():
        logp, entropy = policy.scorer(items, comps, [layout] * len(items), out_len)
    bias = torch.zeros(out.logits[0].shape[-1])
    bias[tk.blocked] = BLOCK_BIAS
    assert len(comps[0]) < layout.width - layout.prompt_width   # padded inside the layout: real tokens there
    for r, c in enumerate(comps):
        dists = [torch.log_softmax(out.logits[t][r].float() + bias, -1) for t in range(len(c))]
        gen = torch.stack([d[c[t]] for t, d in enumerate(dists)])
        torch.testing.assert_close(logp[r, :len(c)], gen, atol=1e-4, rtol=0)
        ent = torch.stack([-(d.exp() * d).sum() for d in dists])
        torch.testing.assert_close(entropy[r, :len(c)], ent, atol=1e-4, rtol=0)
        past = slice(len(c), None)                       # never empty (the old check ran over empty slices)
        assert logp[r, past].numel() >= 2
        assert float(logp[r, past].abs().sum()) == 0.0 and float(entropy[r, past].abs().sum()) == 0.0


def test_lora_reference_is_the_base_model(make_policy, counting_rows):
    policy = make_policy("qwen2_5_vl")
    ro = policy.rollout(_batch(counting_rows[:1]), group_size=2)
    idx = torch.arange(len(ro))
    ref = policy.reference_log_probs(ro, idx).log_probs
    assert torch.equal(ref, ro.log_probs)               # LoRA B starts at 0: policy == reference
    with torch.no_grad():
        for n, prm in policy.p.model.hf.named_parameters():
            if "lora_B" in n:
                prm.add_(0.05)
    moved = policy.log_probs(ro, idx).log_probs.detach()
    assert not torch.allclose(moved, ro.log_probs)
    assert torch.equal(policy.reference_log_probs(ro, idx).log_probs, ref)


def test_full_finetune_reference_reloads_pretrained_weights(make_policy, counting_rows):
    policy = make_policy("qwen2_5_vl", lora_rank=0)
    ro = policy.rollout(_batch(counting_rows[:1]), group_size=2)
    idx = torch.arange(len(ro))
    with torch.no_grad():
        policy.p.model.hf.lm_head.weight.mul_(1.5)
    ref = policy.reference_log_probs(ro, idx).log_probs
    torch.testing.assert_close(ref, ro.log_probs, atol=1e-5, rtol=0)
    assert not torch.allclose(policy.log_probs(ro, idx).log_probs.detach(), ro.log_probs)


def test_trainable_vision_reencodes_with_grad(make_policy, counting_rows):
    policy = make_policy("qwen2_5_vl", lora_rank=0, freeze_vision=False, gradient_checkpointing=True)
    ro = policy.rollout(_batch(counting_rows[:1]), group_size=2)
    scores = policy.log_probs(ro, torch.arange(len(ro)))
    assert torch.equal(scores.log_probs.detach(), ro.log_probs)
    assert torch.isfinite(scores.entropy).all() and (scores.entropy > 0).all()
    (scores.log_probs * ro.mask).sum().backward()
    grads = [p.grad for p in policy.p.model.hf.model.visual.parameters()]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)


def test_save_load_round_trip(make_policy, counting_rows, tmp_path):
    policy = make_policy("qwen2_5_vl")
    path = str(tmp_path / "policy.safetensors")
    with torch.no_grad():
        for n, prm in policy.p.model.hf.named_parameters():
            if prm.requires_grad:
                prm.normal_()
    saved = {n: prm.detach().clone() for n, prm in policy.p.model.hf.named_parameters() if prm.requires_grad}
    policy.save(path)
    other = make_policy("qwen2_5_vl")
    other.load(path)
    now = {n: prm.detach() for n, prm in other.p.model.hf.named_parameters() if prm.requires_grad}
    assert saved.keys() == now.keys() and all(torch.equal(saved[k], now[k]) for k in saved)
    full = make_policy("qwen2_5_vl", lora_rank=0)
    with pytest.raises(ValueError, match="do not match"):
        full.load(path)


def test_rollout_state_survives_select_and_concat(make_policy, counting_rows):
    policy = make_policy("llava")
    a = policy.rollout(_batch(counting_rows[:1]), group_size=2)
    b = policy.rollout(_batch(counting_rows[1:3], step=1), group_size=2)
    both = concat([a, select(b, torch.tensor([1, 2, 3]))])
    scores = policy.log_probs(both, torch.arange(len(both)))
    assert scores.log_probs.shape == both.log_probs.shape
    assert torch.equal(scores.log_probs.detach(), both.log_probs)
    assert [s.meta["num_tokens"] for s in both.samples] == both.mask.sum(1).int().tolist()
    for s, c in zip(both.samples, both.state["completion"]):      # the mask ends at (and includes) EOS
        assert 1 <= c.numel() <= 6
        assert s.meta["finished"] == (int(c[-1]) in policy.p.tokens.stop_ids)
        assert not torch.isin(c[:-1], torch.tensor(policy.p.tokens.stop_ids)).any()


def test_scores_do_not_depend_on_microbatch_neighbours(make_policy, counting_rows):
    """A sample scored next to a much longer one keeps its rollout log-probs bit for bit: each row
    is laid out at its recorded widths (fp32 attention is not invariant to the padded width)."""
    policy = make_policy("qwen2_5_vl", max_new_tokens=4)
    short = policy.rollout(_batch(counting_rows[:1]), group_size=2)
    long_row = dict(counting_rows[1], prompt=counting_rows[1]["prompt"] + " Explain every step." * 4)
    long = policy.rollout(_batch([long_row], step=1), group_size=2)
    both = concat([short, long])
    for idx in (torch.tensor([0, 2]), torch.tensor([3, 1, 2]), torch.arange(4)):
        got = policy.log_probs(both, idx).log_probs.detach()
        assert torch.equal(got, both.log_probs[idx])


def test_deferred_rollout_skips_scoring_and_training_sees_the_same_log_probs(make_policy, counting_rows):
    """old_log_probs=deferred (the default): no scoring forward at rollout; the training forward
    gives exactly the log-probs the rollout would have recorded."""
    recorded = make_policy("qwen2_5_vl", max_new_tokens=5)
    deferred = make_policy("qwen2_5_vl", max_new_tokens=5, old_log_probs="deferred")
    a = recorded.rollout(_batch(counting_rows[:2]), group_size=2)
    calls = []
    deferred.scorer.register_forward_hook(lambda *args: calls.append(1))
    b = deferred.rollout(_batch(counting_rows[:2]), group_size=2)
    assert b.log_probs is None and not calls
    assert [s.output for s in a.samples] == [s.output for s in b.samples] and torch.equal(a.mask, b.mask)
    assert torch.equal(deferred.log_probs(b, torch.arange(len(b))).log_probs.detach(), a.log_probs)
