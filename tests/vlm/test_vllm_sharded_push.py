"""The weights a sharded VLM pushes to vLLM (`vlm.vllm_backend.sharded_hf_weights`, distributed.strategy=fsdp):
gathered one block at a time, they equal what the unsharded model pushes (LoRA merged, Hugging Face names),
and the trained weights are left as they were. Runs FSDP2 over a 1-process gloo group in a fresh interpreter."""

import pytest

pytestmark = pytest.mark.integration        # FSDP2 over a gloo group, in a fresh interpreter

CODE = r'''
import torch
from mmrl.distributed import sharding
from mmrl.config.policies import BuildContext
from vlm.policy import Config, LoraSection, build
from vlm.vllm_backend import hf_weights, sharded_hf_weights

policy = build(Config(model="tiny:qwen2_5_vl", min_pixels=784, max_pixels=3136, max_prompt_tokens=512,
                      max_new_tokens=4, logprob_chunk=4, lora=LoraSection(rank=LORA, alpha=8)),
               BuildContext(device=torch.device("cpu"), seed=0, output_dir="/tmp", precision="fp32"))
hf, peft = policy.p.model.hf, policy.p.model.peft
with torch.no_grad():
    for n, p in hf.named_parameters():
        if p.requires_grad:
            p.add_(0.05 * torch.randn_like(p))                 # trained weights that differ from the start
want = hf_weights(hf, peft)
before = {n: p.detach().clone() for n, p in hf.named_parameters()}
sharding.shard(policy.scorer, "cpu")
blocks = [m for n, m in hf.named_modules() if n and sharding.is_sharded(m)]
got, most = {}, 0
with sharding.gathered(policy.scorer, mode="sharded"):         # what VLMPolicy._before_sampling does
    for part in sharded_hf_weights(hf, peft):
        unsharded = sum(any(not hasattr(p, "to_local") for p in m.parameters()) for m in blocks)
        most = max(most, unsharded)
        got.update(part)
assert most <= 1, most                                           # one block's full weights at a time
assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))[:4]
bad = [k for k in want if hasattr(got[k], "to_local")]
assert not bad, bad[:5]
for k in want:
    assert torch.equal(got[k], want[k]), k
with sharding.gathered(policy.scorer):
    for n, p in hf.named_parameters():
        assert torch.equal(p, before[n]), n                      # merge / unmerge left no trace
print("ok", len(got))
'''


@pytest.fixture(scope="module")
def pushed(fresh_python, in_background, selected_params):
    """{LoRA rank: Future of the fresh interpreter's check}: the selected cases, started together (each
    interpreter keeps about one core busy)."""
    return {lora: in_background(fresh_python, CODE.replace("LORA", str(lora)))
            for lora in sorted(selected_params("lora"))}


@pytest.mark.parametrize("lora", [4, 0], ids=["lora", "full"])
def test_a_sharded_model_pushes_block_by_block_what_the_unsharded_one_pushes(lora, pushed):
    pushed[lora].result()
