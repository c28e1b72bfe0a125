"""Tools through the CLI (a subprocess): a tool from a `file.py:fn` reference, an MCP stdio server's tool (started
by the run) and the sandboxed Python tool in the episodes of a file environment, run by an asynchronous trainer's
rollout worker (Ray), an image result shown in the next
turn, a failing call shown to the model and counted in the metrics and the saved samples. (Every failure kind, in
process: test_vlm_tools.py.)

A random tiny model writes no tool calls, so the run starts from one that was taught to (assets/tiny/tool_caller,
teacher forcing on the policy's own scoring of scripted episodes): it calls `picture` for a red square (an image
and its name), then the MCP server's `swatch` for a pink one (which fails on the server: there is none), then runs
`print(6*7)` in the sandbox, then answers "right", which the strict corridor takes. The run samples near-greedily
(temperature 0.02) and every taught token is the model's most likely one by a margin, so it replays those replies."""

from __future__ import annotations

import json
import math
import os
import warnings
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
ASSET = os.path.join(REPO, "assets", "tiny", "tool_caller")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


REPLIES = [call("picture", color="red"), call("swatch", color="pink"), call("python", code="print(6*7)"), "right"]
POLICY = dict(name="vlm", min_pixels=784, max_pixels=3136, max_prompt_tokens=4096, max_new_tokens=96,
              logprob_chunk=16, format_prompt="none", lora={"rank": 0}, temperature=0.02)   # near-greedy: the taught replies
ENV_SECTION = dict(name=CORRIDOR, length=4, strict=True, max_turns=4, max_tool_calls=7)
MAX_STEPS = 600
TOOL_LIST = [f"{TOOLS}:picture", {"mcp": f"{sys.executable} {MCP_SERVER}", "select": ["swatch"]},
             "python"]


def _demonstrations(model: str, output_dir: str):
    """The policy on `model` and one scripted episode (REPLIES, one per turn) per environment seed."""
    from mmrl.config import EnvConfig
    from mmrl.config.policies import BuildContext
    from mmrl.types import PromptBatch
    from vlm.policy import Config, LoraSection, build

    env = EnvConfig(**{k: v for k, v in ENV_SECTION.items() if k not in ("length", "strict")},
                    kwargs={"length": 4, "strict": True})
    fields = {k: v for k, v in POLICY.items() if k not in ("name", "lora", "temperature")}
    torch.manual_seed(0)
    policy = build(Config(model=model, lora=LoraSection(rank=0), **fields),
                   BuildContext(device=torch.device("cpu"), seed=0, output_dir=output_dir, precision="fp32", env=env,
                                tools=tuple(TOOL_LIST)))
    tok, stop = policy.p.model.tokenizer, policy.p.tokens.stop_ids[0]
    backend = policy.p.backend

    def scripted(contexts, spec, seeds, device, states=None):      # sample_rows and sample_turns, replaced
        texts = [REPLIES[min(scripted.k, len(REPLIES) - 1)] for _ in contexts]
        scripted.k += 1
        outs = [(torch.tensor(tok(t, add_special_tokens=False).input_ids + [stop]), True) for t in texts]
        return outs if states is None else (outs, [None] * len(contexts))

    demos = []
    for seed in range(2):                            # one scripted episode per seed (its own call counter)
        scripted.k = 0
        backend.sample_rows = backend.sample_turns = scripted
        demos.append(policy.rollout(PromptBatch(rows=[{"env_seed": seed}], index=[0], seeds=[0], step=0), 1))
    del backend.sample_rows, backend.sample_turns                 # the class's own methods again
    return policy, demos


def _sure(policy, ro, lp=None) -> bool:
    """Every taught token is the model's most likely one by a margin (p > 0.75: its logit leads every other by
    log 3, so sampling at temperature 0.02 picks it but for odds of e^-55)."""
    if lp is None:
        with torch.no_grad():
            lp = policy.log_probs(ro, torch.tensor([0])).log_probs                  # [1, T]
    return bool((lp.detach() + (1 - ro.mask)).min() > math.log(0.75))


@pytest.fixture(scope="module")
def tool_caller(tmp_path_factory):
    """A tiny Qwen2.5-VL folder that writes REPLIES, one per turn: the asset (assets/tiny/tool_caller) when it still
    does, else the asset (or tiny:qwen2_5_vl) taught until it does (teacher forcing on the policy's own scoring of the
    demonstrations; a minute or more, so rebuild the asset: MMRL_WRITE_TOOL_CALLER=1 pytest <this file>)."""
    start = ASSET if os.path.isdir(ASSET) else "tiny:qwen2_5_vl"
    policy, demos = _demonstrations(start, str(tmp_path_factory.mktemp("demos")))
    if start == ASSET and all(_sure(policy, ro) for ro in demos) and not os.environ.get("MMRL_WRITE_TOOL_CALLER"):
        return ASSET
    warnings.warn(f"assets/tiny/tool_caller no longer writes the demonstrations (or is missing): teaching {start}")
    model = policy.p.model.hf
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    model.train()
    streak = 0                 # demos found sure in a row, with no step between: all are sure with these weights
    for it in range(MAX_STEPS):
        ro = demos[it % len(demos)]
        lp = policy.log_probs(ro, torch.tensor([0])).log_probs                     # [1, T]
        if _sure(policy, ro, lp):
            streak += 1
            if streak == len(demos):
                break
            continue
        streak = 0
        loss = -(lp * ro.mask).sum() / ro.mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert streak == len(demos), f"the replies were not learned in {MAX_STEPS} steps (loss per token {float(loss):.3f})"
    out = ASSET if os.environ.get("MMRL_WRITE_TOOL_CALLER") else str(tmp_path_factory.mktemp("tool_caller"))
    policy.p.model.hf.save_pretrained(out)
    policy.p.model.processor.save_pretrained(out)
    return out


def test_a_file_tool_and_an_mcp_server_run_in_episodes_and_a_failure_is_shown_and_counted(tmp_path, tool_caller, mmrl_cmd,
                                                                                  read_metrics):
    cfg = {"output_dir": str(tmp_path / "run"), "seed": 0, "max_steps": 1,
           "policy": {**POLICY, "model": tool_caller}, "env": ENV_SECTION, "tools": TOOL_LIST,
           "rewards": [{"name": "env_return"}],
           "train": {"prompts_per_step": 2, "group_size": 2, "samples_per_microbatch": 2},
           "optim": {"lr": 1e-4}, "algo": {"filter": {"name": "none"}},
           "eval": {"every": 0}, "checkpoint": {"every": 0}, "logging": {"save_samples_every": 1},
           "asynchronous": {"enabled": True, "max_staleness": 0, "cpus_per_worker": 1}}   # episodes in a rollout worker
    path = tmp_path / "tools.yaml"
    OmegaConf.save(OmegaConf.create(cfg), path)
    done = subprocess.run(mmrl_cmd("train", str(path)), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr                 # the server's own traceback is in its log
    with open(tmp_path / "run" / "tools" / "mcp_1.log") as f:
        assert "Traceback" in f.read()
    rows = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(rows) == 1 and "async/staleness/mean" in rows[0]              # trained from a Ray rollout worker
    for name in ("picture", "swatch", "python"):
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
    assert any(c["name"] == "python" and c["error"] is None and c["result"] == "42\n" for c in calls)
    assert all(s["output"].endswith("right") for s in samples)
