"""Fixtures for the VLM adapter tests: tiny models built offline into a per-session cache."""

from __future__ import annotations

import os

import pytest
import torch

from mmrl.config.policies import BuildContext


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine OpenMP spin-waiting makes tiny-model steps
    10x slower when the other core is busy. Subprocesses (the CLI test) inherit OMP_NUM_THREADS."""
    threads, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env


@pytest.fixture(scope="session", autouse=True)
def tiny_cache(tmp_path_factory):
    """`tiny:<family>` models are built once per session here (subprocesses inherit the env var)."""
    root = tmp_path_factory.mktemp("tiny_models")
    old = os.environ.get("MMRL_TINY_CACHE")
    os.environ["MMRL_TINY_CACHE"] = str(root)
    yield str(root)
    if old is None:
        os.environ.pop("MMRL_TINY_CACHE", None)
    else:
        os.environ["MMRL_TINY_CACHE"] = old


@pytest.fixture
def make_policy(tmp_path):
    """Build a VLM policy on a tiny model: make_policy("llava", max_new_tokens=4, lora_rank=0)."""
    from vlm.policy import Config, LoraSection, build

    def make(family: str = "qwen2_5_vl", lora_rank: int = 4, **overrides):
        fields = dict(model=f"tiny:{family}", min_pixels=784, max_pixels=3136, max_prompt_tokens=512,
                      max_new_tokens=6, logprob_chunk=4, lora=LoraSection(rank=lora_rank, alpha=8),
                      old_log_probs="rollout")       # the rollout records its log-probs, for comparisons

        fields.update(overrides)
        torch.manual_seed(0)
        return build(Config(**fields), BuildContext(device=torch.device("cpu"), seed=0, output_dir=str(tmp_path), precision="fp32"))

    return make


@pytest.fixture
def counting_rows():
    from shapes_world.standins import counting

    return counting(n=4, seed=0)


@pytest.fixture
def assert_same_scores():
    """Two ways of scoring the same rows agree: log-probs and entropies within 1e-5 (0 past each row's end)
    and the gradients (name -> grad) of the scores, within 1e-5 + 1e-4 relative."""

    def check(got, got_grads, want, want_grads, mask):
        torch.testing.assert_close(got.log_probs, want.log_probs, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.entropy, want.entropy, atol=1e-5, rtol=0)
        assert float((got.log_probs * (1 - mask)).abs().sum()) == 0.0
        assert got_grads.keys() == want_grads.keys() and len(want_grads) > 10
        for name in want_grads:
            torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-5, rtol=1e-4, msg=name)

    return check
