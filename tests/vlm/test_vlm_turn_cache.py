"""The cross-turn KV cache of episodes (vlm/turn_cache.py): a turn that continues a trajectory's cache reads what a
fresh prefill of its whole context reads (both tiny families, observation images every turn; tool results with
images from a model that calls tools), greedy episodes are the same with and without it, and it is only used
where every context extends the last."""

from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

from mmrl.config import ENV_KEYS, EnvConfig
from mmrl.config.policies import BuildContext
from mmrl.types import PromptBatch
from tests import REPO
from vlm.turn_cache import TurnCache, extend, extend_rows, is_continued, start

HERE = os.path.dirname(__file__)
ENV_FILE = os.path.join(HERE, "agent_env.py") + ":Corridor"


@pytest.fixture
def agent(tmp_path):
    from vlm.policy import Config, LoraSection, build

    def make(model="tiny:qwen2_5_vl", tools=(), policy: dict | None = None, **env_fields):
        own = {k: v for k, v in env_fields.items() if k in ENV_KEYS}
        env = EnvConfig(**{"name": ENV_FILE, "max_turns": 4, **own},
                        kwargs={k: v for k, v in env_fields.items() if k not in ENV_KEYS})
        fields = dict(model=model, min_pixels=784, max_pixels=3136, max_prompt_tokens=4096, max_new_tokens=6,
                      logprob_chunk=8, lora=LoraSection(rank=0), format_prompt="none", old_log_probs="rollout")
        fields.update(policy or {})
        torch.manual_seed(0)
        return build(Config(**fields), BuildContext(device=torch.device("cpu"), seed=0, output_dir=str(tmp_path),
                                                  precision="fp32", env=env, tools=tuple(tools)))

    return make


def spy(policy) -> list:
    """Record, per generate call, (context, a copy of its state) of every row that continues its cache."""
    seen, real = [], policy.p.backend.sample_turns

    def recording(rows, spec, seeds, device, states):
        call = [(x, TurnCache(st.ids.clone(), copy.deepcopy(st.cache))) for x, st in zip(rows, states)
                if is_continued(st, x)]
        if call:
            seen.append(call)
        return real(rows, spec, seeds, device, states)

    policy.p.backend.sample_turns = recording
    return seen


def assert_reads_the_same(policy, seen: list, at_least: int) -> None:
    """Each call's continued rows, extended together (as a turn runs them) and each alone, read what a fresh
    prefill of the row's whole context reads: the hidden state that predicts the next token, and the positions."""
    hf, p = policy.p.model.hf, policy.p
    args = (p.tokens.pad_id, p.tokens.image_token_id, torch.device("cpu"))
    assert sum(len(call) for call in seen) >= at_least and any(len(call) > 1 for call in seen)
    with torch.no_grad():
        for call in seen:
            together, deltas, _ = extend_rows(hf, [copy.deepcopy(st) for _, st in call], [x for x, _ in call], *args)
            for k, (x, state) in enumerate(call):
                alone, delta = extend(hf, copy.deepcopy(state), x, *args)
                _, fresh, fresh_delta = start(hf, x, *args)
                torch.testing.assert_close(alone, fresh, atol=1e-5, rtol=0)
                torch.testing.assert_close(together[k:k + 1], fresh, atol=1e-5, rtol=0)
                assert torch.equal(delta, fresh_delta) and torch.equal(deltas[k:k + 1], fresh_delta)


def batch(seeds=(3, 4)) -> PromptBatch:
    return PromptBatch(rows=[{"env_seed": s} for s in seeds], index=list(range(len(seeds))),
                       seeds=[100 + i for i in range(len(seeds))], step=0)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_a_cached_turn_reads_what_a_fresh_prefill_of_its_context_reads(agent, family):
    policy = agent(f"tiny:{family}", length=8)
    seen = spy(policy)
    ro = policy.rollout(batch(), 2)
    assert_reads_the_same(policy, seen, at_least=6)
    assert any(len(x.images) >= 3 for call in seen for x, _ in call)   # images arrived after the cached part
    new = policy.log_probs(ro, torch.arange(len(ro))).log_probs        # scoring does not use the cache: ratio 1
    assert torch.equal(new.detach() * ro.mask, ro.log_probs * ro.mask)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_greedy_episodes_are_the_same_with_and_without_the_cache(agent, family):
    replies = []
    for cache in (True, False):
        policy = agent(f"tiny:{family}", length=8, policy={"cache_turns": cache})
        assert policy.episodes._caches_turns() is cache
        replies.append([s.meta["replies"] for s in policy.generate_eval(batch((5, 6, 7)))])
    assert replies[0] == replies[1] and sum(len(r) for r in replies[0]) >= 6


def test_the_cache_is_kept_only_where_each_context_extends_the_last(agent):
    assert agent(history_turns=None).episodes._caches_turns()
    assert not agent(history_turns=2).episodes._caches_turns()
    assert not agent(policy={"cache_turns": False}).episodes._caches_turns()


def test_a_cached_turn_after_tool_results_with_images_reads_what_a_fresh_prefill_reads(agent):
    """The taught tool caller (assets/tiny/tool_caller) writes its calls itself, so the turns after a tool's result
    (an image) continue its cache."""
    pytest.importorskip("mcp")
    tools = [os.path.join(HERE, "agent_tools.py") + ":picture",
             {"mcp": f"{sys.executable} {os.path.join(REPO, 'tests', 'tools', 'mcp_server.py')}", "select": ["swatch"]},
             "python"]
    policy = agent(os.path.join(REPO, "assets", "tiny", "tool_caller"), tools=tools, length=4, strict=True,
                   max_tool_calls=7, policy={"max_new_tokens": 96, "temperature": 0.02})
    seen = spy(policy)
    ro = policy.rollout(batch((0,)), 2)
    calls = ro.samples[0].meta["tool_calls"]
    assert [c["name"] for reply in calls for c in reply] == ["picture", "swatch", "python"]
    assert_reads_the_same(policy, seen, at_least=6)
    assert any(len(x.images) >= 2 for call in seen for x, _ in call)
