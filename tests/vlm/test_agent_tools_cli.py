"""Tools through the CLI (a subprocess): a tool from a `file.py:fn` reference and an MCP stdio server's tool (started
by the run) in the episodes of a file environment, image results shown in the next turn, a failing call shown to
the model and counted in the metrics and the saved samples. (Every failure kind, in process: test_vlm_tools.py.)

A random tiny model writes no tool calls, so the run starts from one taught to (teacher forcing on the policy's
own scoring of scripted trajectories): it calls `picture` for a red square (an image and its name), then the MCP
server's `swatch` for a pink one (which fails on the server: there is none), then answers "right", which the
strict corridor takes. The run samples
near-greedily (temperature 0.05), and the teaching stops once every taught token is the most likely one by a
margin, so the run replays the taught replies."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from tests import REPO

pytestmark = [pytest.mark.slow, pytest.mark.integration]
pytest.importorskip("mcp")
HERE = os.path.dirname(__file__)
CORRIDOR = os.path.join(HERE, "agent_env.py") + ":Corridor"
TOOLS = os.path.join(HERE, "agent_tools.py")
MCP_SERVER = os.path.join(os.path.dirname(HERE), "tools", "mcp_server.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


REPLIES = [call("picture", color="red"), call("swatch", color="pink"), "right"]
POLICY = dict(name="vlm", min_pixels=784, max_pixels=3136, max_prompt_tokens=4096, max_new_tokens=96,
              logprob_chunk=16, format_prompt="none", lora={"rank": 0}, temperature=0.05)   # near-greedy: the taught replies
ENV_SECTION = dict(name=CORRIDOR, length=4, strict=True, max_turns=3, max_tool_calls=7)
MAX_STEPS = 300
TOOL_LIST = [f"{TOOLS}:picture", {"mcp": f"{sys.executable} {MCP_SERVER}", "select": ["swatch"]}]


@pytest.fixture(scope="module")
def tool_caller(tmp_path_factory):
    """A tiny Qwen2.5-VL folder taught to write REPLIES, one per turn (module docstring; ~15 s)."""
    from mmrl.config import EnvConfig
    from mmrl.config.policies import BuildContext
    from mmrl.types import PromptBatch
    from vlm.policy import Config, LoraSection, build
    from vlm.tiny import resolve_model

    env = EnvConfig(**{k: v for k, v in ENV_SECTION.items() if k not in ("length", "strict")},
                    kwargs={"length": 4, "strict": True})
    fields = {k: v for k, v in POLICY.items() if k not in ("name", "lora", "temperature")}
    torch.manual_seed(0)
    policy = build(Config(model="tiny:qwen2_5_vl", lora=LoraSection(rank=0), **fields),
                   BuildContext(device=torch.device("cpu"), seed=0, output_dir=str(tmp_path_factory.mktemp("sft")),
                                precision="fp32", env=env, tools=tuple(TOOL_LIST)))
    tok, stop = policy.p.model.tokenizer, policy.p.tokens.stop_ids[0]
    real = policy.p.backend.sample_rows

    def scripted(contexts, spec, seeds, device):
        outs = real(contexts, spec, seeds, device)
        texts = [REPLIES[min(scripted.k, 2)] for _ in outs]
        scripted.k += 1
        return [(torch.tensor(tok(t, add_special_tokens=False).input_ids + [stop]), True) for t in texts]

    rows = [{"env_seed": s} for s in range(2)]
    demos = []
    for r in rows:                                   # one scripted episode per seed (its own call counter)
        scripted.k = 0
        policy.p.backend.sample_rows = scripted
        demos.append(policy.rollout(PromptBatch(rows=[r], index=[0], seeds=[0], step=0), 1))
    policy.p.backend.sample_rows = real
    model = policy.p.model.hf
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    sure = []                  # per demo: every taught token the model's most likely by a margin (p > 0.75)
    for it in range(MAX_STEPS):
        ro = demos[it % len(demos)]
        lp = policy.log_probs(ro, torch.tensor([0])).log_probs                     # [1, T]
        loss = -(lp * ro.mask).sum() / ro.mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sure = (sure + [bool((lp.detach() + (1 - ro.mask)).min() > math.log(0.75))])[-len(demos):]
        if len(sure) == len(demos) and all(sure):
            break
    assert all(sure), f"the replies were not learned in {MAX_STEPS} steps (loss per token {float(loss):.3f})"
    out = str(tmp_path_factory.mktemp("tool_caller"))
    source = resolve_model("tiny:qwen2_5_vl")
    for name in os.listdir(source):
        if not name.endswith(".safetensors") and os.path.isfile(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), out)
    model.save_pretrained(out)
    return out


def test_a_file_tool_and_an_mcp_server_run_in_episodes_and_a_failure_is_shown_and_counted(tmp_path, tool_caller, mmrl_cmd,
                                                                                  read_metrics):
    cfg = {"output_dir": str(tmp_path / "run"), "seed": 0, "max_steps": 1,
           "policy": {**POLICY, "model": tool_caller}, "env": ENV_SECTION, "tools": TOOL_LIST,
           "rewards": [{"name": "env_return"}],
           "train": {"prompts_per_step": 2, "group_size": 2, "samples_per_microbatch": 2},
           "optim": {"lr": 1e-4}, "algo": {"filter": {"name": "none"}},
           "eval": {"every": 0}, "checkpoint": {"every": 0}, "logging": {"save_samples_every": 1}}
    path = tmp_path / "tools.yaml"
    OmegaConf.save(OmegaConf.create(cfg), path)
    done = subprocess.run(mmrl_cmd("train", str(path)), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr                 # the server's own traceback is in its log
    with open(tmp_path / "run" / "tools" / "mcp_1.log") as f:
        assert "Traceback" in f.read()
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(rows) == 1
    for name in ("picture", "swatch"):
        assert f"tools/{name}/calls" in rows[0], name
    assert all(r["tools/calls_per_episode"] > 0 and r["tools/episodes_calling_first"] > 0 for r in rows)
    assert sum(r["tools/picture/calls"] for r in rows) > 0 and sum(r["tools/errors/exception"] for r in rows) > 0
    assert all(r["tools/errors"] <= r["tools/calls_per_episode"] for r in rows)
    # the saved episodes show each call with the result the model read
    with open(tmp_path / "run" / "samples" / "step_000001.jsonl") as f:
        samples = [json.loads(line) for line in f]
    calls = [c for s in samples for reply in s.get("tool_calls", []) for c in reply]
    assert any(c["name"] == "picture" and c["images"] == 1 and c["result"] == "a red square" for c in calls)
    assert any(c["name"] == "swatch" and c["error"] == "exception" and c["result"].startswith("Error (exception): ")
               for c in calls)
    assert all(s["output"].endswith("right") for s in samples)
