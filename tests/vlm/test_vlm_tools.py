"""Tool calls in the VLM adapter's episodes (tools/, vlm/episodes.py): every failure shown to the model and
counted, token-exact trajectories across tool boundaries with images for both tiny families, the on-policy
ratio exactly 1 on tool trajectories, and a template's own tool rendering equal to the format's fallback.

Replies that call tools are scripted (a random tiny model writes no JSON): the `script` fixture wraps the backend's
`sample_rows` and replaces the sampled tokens of chosen (call, row) pairs with a tokenized reply, passing the
others through, so every other reply is the model's own sample."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from mmrl.config import ENV_KEYS, EnvConfig
from mmrl.config.policies import BuildContext
from mmrl.episodes import EpisodeMeta, episode_metrics
from mmrl.types import PromptBatch

HERE = os.path.dirname(__file__)
ENV_FILE = os.path.join(HERE, "agent_env.py") + ":Corridor"
TOOLS_FILE = os.path.join(HERE, "agent_tools.py")


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture
def tool_agent(tmp_path):
    """tool_agent(family, tools=[...], env_fields..., policy=dict(...)) -> a VLM policy running Corridor episodes
    with tools."""
    from vlm.policy import Config, LoraSection, build

    def make(family: str = "qwen2_5_vl", tools=(), policy: dict | None = None, **env_fields):
        own = {k: v for k, v in env_fields.items() if k in ENV_KEYS}
        env = EnvConfig(**{"name": ENV_FILE, "max_turns": 3, **own},
                        kwargs={k: v for k, v in env_fields.items() if k not in ENV_KEYS})
        fields = dict(model=f"tiny:{family}", min_pixels=784, max_pixels=3136, max_prompt_tokens=4096,
                      max_new_tokens=4, logprob_chunk=4, lora=LoraSection(rank=0), format_prompt="none",
                      old_log_probs="rollout")
        fields.update(policy or {})
        torch.manual_seed(0)
        return build(Config(**fields), BuildContext(device=torch.device("cpu"), seed=0, output_dir=str(tmp_path),
                                                  precision="fp32", env=env, tools=tuple(tools)))

    return make


def batch(seeds=(3,)) -> PromptBatch:
    return PromptBatch(rows=[{"env_seed": s} for s in seeds], index=list(range(len(seeds))),
                       seeds=[100 + i for i in range(len(seeds))], step=0)


def test_every_failure_of_a_call_is_shown_to_the_model_and_counted(tool_agent, script):
    tools = [f"{TOOLS_FILE}:lookup", {"name": f"{TOOLS_FILE}:sleepy", "timeout_s": 0.2}, f"{TOOLS_FILE}:broken"]
    policy = tool_agent(tools=tools, max_turns=3, max_tool_calls=6)
    reply = "".join([call("lookup", key="right"),                        # fine
                     "<tool_call>{not json}</tool_call>",                  # malformed
                     call("search", query="x"),                            # unknown_tool
                     call("lookup", word="right"),                         # bad_arguments
                     call("sleepy", seconds=5),                            # timeout
                     call("broken", n=3),                                  # exception
                     call("lookup", key="left")])                          # limit (the 7th call)
    script(policy, lambda k, i: reply if k == 0 else None)
    ro = policy.rollout(batch(), 2)
    for s in ro.samples:
        calls = s.meta[EpisodeMeta.TOOL_CALLS][0]
        assert [c["error"] for c in calls] == [None, "malformed", "unknown_tool", "bad_arguments", "timeout",
                                               "exception", "limit"]
        assert calls[0]["result"] == "go towards the last cell"
        assert s.meta[EpisodeMeta.ACTIONS][0] is None and s.meta[EpisodeMeta.INVALID] == 0   # no env step, not invalid
        assert s.meta[EpisodeMeta.TURN_REWARDS][0] == 0.0
        assert s.meta[EpisodeMeta.TOOLS] == ["lookup", "sleepy", "broken"]
    # the model reads every result: the scored sequence holds each error message after the reply
    v = ro.state["views"][0][0]
    text = policy.p.model.tokenizer.decode(v.inputs.input_ids)
    after = text[text.index("</tool_call>", text.rindex('"left"')):]
    for kind, detail in [("malformed", "not valid JSON"), ("unknown_tool", "there is no tool 'search'"),
                         ("bad_arguments", "unknown argument 'word'"), ("timeout", "longer than 0.2 s"),
                         ("exception", "RuntimeError: broken on 3"), ("limit", "env.max_tool_calls")]:
        assert f"Error ({kind}): " in after and detail in after, kind
    assert "<tool_response>\ngo towards the last cell\n</tool_response>" in after
    m = episode_metrics(ro.samples, torch.zeros(len(ro)), 2)
    assert float(m["tools/calls_per_episode"].value) == 7 and float(m["tools/errors"].value) == 6
    for kind in ("malformed", "unknown_tool", "bad_arguments", "timeout", "exception", "limit"):
        assert float(m[f"tools/errors/{kind}"].value) == 1
    assert float(m["tools/lookup/calls"].value) == 3 and float(m["tools/broken/calls"].value) == 1
    assert float(m["tools/episodes_calling_first"].value) == 1.0


SCRIPT = {0: call("picture", color="red"), 2: call("zoom", region="top-left") + call("picture", color="blue")}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava"])
def test_trained_ids_are_the_generated_ids_at_every_tool_boundary_with_images(tool_agent, script, family):
    """Calls 0 and 2 of every trajectory call tools that return images (a generated picture, a zoom of the
    observation); calls 1 and 3 are the model's samples (env steps). Every reply is scored in exactly the
    context it was generated from, and the trained ids are exactly the generated ones."""
    policy = tool_agent(family, tools=[f"{TOOLS_FILE}:picture", "zoom"], max_turns=4, length=8,
                        policy={"max_new_tokens": 6})
    script = script(policy, lambda k, i: SCRIPT.get(k))
    ro = policy.rollout(batch((5,)), 2)
    for j in range(len(ro)):
        (view,) = ro.state["views"][j]
        ids, positions = view.inputs.input_ids, view.positions.tolist()
        generated = []
        for contexts, outs in script.calls:
            if j >= len(contexts):
                continue
            ctx, out = contexts[j], outs[j]
            n = len(ctx)
            assert torch.equal(ids[:n], ctx)                                 # the context is a prefix, as generated
            assert torch.equal(ids[n:n + len(out)], out)                     # followed by the generated tokens
            assert positions[len(generated):len(generated) + len(out)] == list(range(n, n + len(out)))
            generated += out.tolist()
        assert ids[positions].tolist() == generated                          # trained ids = generated ids, no others
        calls = ro.samples[j].meta[EpisodeMeta.TOOL_CALLS]
        assert [c["images"] for c in calls[0]] == [1] and [c["images"] for c in calls[2]] == [1, 1]
        assert all(c["error"] is None for c in calls[0] + calls[2])
        # the images in order: the first observation, the picture, the next observation, the zoom and picture
        assert len(view.inputs.images) == 5 == len(ro.samples[j].images)
    assert len(script.calls) == 4


def test_on_policy_ratio_is_exactly_one_on_tool_trajectories(tool_agent, script):
    policy = tool_agent(tools=[f"{TOOLS_FILE}:picture", "zoom"], max_turns=4, length=8)
    script(policy, lambda k, i: SCRIPT.get(k) if i != 1 else None)         # trajectory 1 of each group: no tools
    ro = policy.rollout(batch((3, 4)), 3)
    assert ro.log_probs is not None and ro.mask.sum() > 40
    for idx in (torch.tensor([5, 0, 3]), torch.tensor([1]), torch.tensor([2, 4])):
        new = policy.log_probs(ro, idx).log_probs
        assert torch.equal(new.detach() * ro.mask[idx], ro.log_probs[idx] * ro.mask[idx])


def test_a_history_window_keeps_the_results_of_the_kept_calls(tool_agent, script):
    """With env.history_turns=1 the context after a call is the current observation, the call and its result;
    each reply is still scored in the context it was generated from."""
    policy = tool_agent(tools=[f"{TOOLS_FILE}:picture"], max_turns=4, history_turns=1, length=8)
    script = script(policy, lambda k, i: call("picture", color="green") if k in (0, 1) else None)
    ro = policy.rollout(batch((5,)), 1)
    views = ro.state["views"][0]
    tok = policy.p.model.tokenizer
    assert "a green square" in tok.decode(script.calls[1][0][0]) and "a green square" in tok.decode(script.calls[2][0][0])
    generated = [out for _, outs in script.calls for out in outs]
    trained = torch.cat([v.inputs.input_ids[v.positions] for v in views])
    assert torch.equal(trained, torch.cat(generated))
    new = policy.log_probs(ro, torch.tensor([0])).log_probs
    assert torch.equal(new.detach() * ro.mask, ro.log_probs * ro.mask)


# A ChatML template that renders tools as Qwen2.5's does (its system text and `role: tool` as <tool_response>
# blocks in a user turn), with Qwen2-VL's image parts.
NATIVE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] != 'system' %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{%- if not tools %}{{- '<|im_start|>system\\n' }}"
    "{{- message['content'] if message['content'] is string else message['content'][0]['text'] }}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}{%- for c in message['content'] %}"
    "{%- if c['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}{%- else %}{{- c['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}{%- else %}{%- for c in message['content'] %}"
    "{%- if c['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}{%- else %}{{- c['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_a_template_that_renders_tools_gives_the_same_tokens_as_the_format(tool_agent):
    """Qwen2.5's way of rendering tools (system text, `role: tool` turns) through the template's own `tools=`
    and the hermes format's fallback for a template without tools give the same token ids."""
    from tools import ToolResult
    from vlm.turns import TurnTemplate

    policy = tool_agent(tools=[f"{TOOLS_FILE}:picture", "zoom"])
    runner = policy.episodes
    fallback = runner.template
    assert not fallback.native_tools
    processor = copy.deepcopy(policy.p.model.processor)
    processor.chat_template = NATIVE
    native = TurnTemplate(processor, fallback.keys, fallback.resize, fallback.image_kwargs, fallback.eos_text)
    native.use_tools(runner.tools.format, runner.tools.schemas)
    assert native.native_tools
    from PIL import Image

    image = Image.new("RGB", (56, 28), (10, 200, 30))
    for system in (None, "You play a corridor game."):
        a, b = fallback.head(system, "Walk right.", image), native.head(system, "Walk right.", image)
        assert torch.equal(a.input_ids, b.input_ids)
        assert "<tools>" in policy.p.model.tokenizer.decode(a.input_ids)
    results = [ToolResult("a red square", (image,)), ToolResult("Error (timeout): too slow")]
    for ended in (True, False):
        a, b = fallback.tool_turn(results, ended), native.tool_turn(results, ended)
        assert torch.equal(a.input_ids, b.input_ids)
        assert len(a.images) == 1


def test_tools_announced_in_the_first_prompt_and_reward_samples_keep_the_calls(tool_agent, script):
    policy = tool_agent(tools=[f"{TOOLS_FILE}:lookup"], max_turns=2)
    script(policy, lambda k, i: call("lookup", key="left") if k == 0 else None)
    ro = policy.rollout(batch(), 2)
    s = ro.samples[0]
    first = policy.p.model.tokenizer.decode(ro.state["views"][0][0].inputs.input_ids)
    head = first[:first.index("<|im_start|>user")]
    assert '{"type": "function", "function": {"name": "lookup", "description": "Look a word up' in head
    assert "within <tool_call></tool_call> XML tags" in head                      # the system message announces it
    assert s.meta[EpisodeMeta.TOOL_CALLS][0] == [{"name": "lookup", "arguments": {"key": "left"}, "error": None,
                                                  "result": "go towards cell 0", "images": 0}]
    assert s.meta[EpisodeMeta.TOOL_CALLS][1] == []                               # the model's own reply: an env step
    states = s.meta[EpisodeMeta.STATES]                  # GiGPO's anchor states: a reply after a result is another
    assert states[0] != states[1] and len(set(states)) == len(states)
    json.dumps(s.meta[EpisodeMeta.TOOL_CALLS])                                   # written to samples/*.jsonl as is
