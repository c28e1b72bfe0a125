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


class _Script:
    """Wraps the backend's `sample_rows` and `sample_turns` (the cross-turn cache's path, vlm/turn_cache.py):
    `replies(k, i)` -> the text of row i of generate call k, or None for the model's own sample. Records every
    call's contexts and what was returned. (A scripted reply is not what the cache read: the next turn's context
    does not extend it, and that trajectory is prefilled afresh.)"""

    def __init__(self, policy, replies):
        self.policy, self.replies, self.calls = policy, replies, []
        self.real, self.real_turns = policy.p.backend.sample_rows, policy.p.backend.sample_turns
        tok = policy.p.model.tokenizer
        self.encode = lambda text: torch.tensor(tok(text, add_special_tokens=False).input_ids
                                                + [policy.p.tokens.stop_ids[0]])
        policy.p.backend.sample_rows = self
        policy.p.backend.sample_turns = self.turns

    def turns(self, contexts, spec, seeds, device, states):
        outs, states = self.real_turns(contexts, spec, seeds, device, states)
        return self._script(contexts, list(outs)), states

    def __call__(self, contexts, spec, seeds, device):
        return self._script(contexts, list(self.real(contexts, spec, seeds, device)))

    def _script(self, contexts, outs):
        k = len(self.calls)
        for i in range(len(outs)):
            text = self.replies(k, i)
            if text is not None:
                outs[i] = (self.encode(text), True)
        self.calls.append(([x.input_ids.clone() for x in contexts], [o[0].clone() for o in outs]))
        return outs


@pytest.fixture
def script():
    """`script(policy, replies)`: scripted replies in a policy's episodes (`_Script`); returns the recorder."""
    return _Script
