"""Multi-role episodes in process (vlm/roles.py, mmrl/loop/team.py): two tiny VLMs of different families play the
signal game; each policy's rollout holds its role's trajectories in groups of G per seed, the listener reads the
speaker's message of its own episode, the training forward scores exactly what each policy sampled (ratio 1), and
both policies change with their own optimizers. A shared policy with role prompts plays the matching game, both
roles at once."""

from __future__ import annotations

import os

import pytest
import torch
from omegaconf import OmegaConf

from mmrl.config import load_config
from tests import REPO

TEAM = os.path.join(REPO, "configs", "tiny", "team_tiny.yaml")
REWARD = os.path.join(REPO, "tests", "vlm", "team_reward.py") + ":distinct_letters"


def team_run(tmp_path, *overrides: str):
    from mmrl.loop.trainer import setup

    cfg = load_config(TEAM, [f"output_dir={tmp_path / 'run'}", f"rewards=[{{name: '{REWARD}'}}]",
                             "policy.old_log_probs=rollout", "policies.listener.policy.old_log_probs=rollout",
                             "policy.max_new_tokens=12", *overrides])
    return setup(cfg)


def test_each_policy_samples_its_roles_and_learns_from_them(tmp_path):
    run = team_run(tmp_path)
    batch = run.generator.next_batch(0)
    assert set(batch.batches) == {"policy", "listener"}
    g, p = 4, 2
    for name, role in (("policy", "speaker"), ("listener", "listener")):
        ro = batch.batches[name].rollout
        assert len(ro) == p * g and ro.group.tolist() == [0] * g + [1] * g
        assert [s.meta["role"] for s in ro.samples] == [role] * (p * g)
        assert all(f"role {role} trajectory {j % g}" in s.id for j, s in enumerate(ro.samples))
        assert all(s.meta["turns"] == 1 for s in ro.samples)
        # the actions are the reply's tokens: as many trained columns as the reply had tokens
        assert ro.mask.sum(1).tolist() == [float(s.meta["turn_tokens"][0]) for s in ro.samples]
    speakers, listeners = batch.batches["policy"].rollout.samples, batch.batches["listener"].rollout.samples
    for s, lis in zip(speakers, listeners):                  # the same joint episode: same seed, its message
        assert s.meta["env_seed"] == lis.meta["env_seed"]
        assert "The secret word is" in s.prompt
        message = " ".join(s.output.split())[:200] or "(nothing)"
        assert f"Your partner's message: {message}" in lis.prompt
    assert len({s.output for s in speakers}) > 1            # sampled, not all alike
    # the rewards differ within groups: both policies get a signal
    assert float(batch.batches["policy"].advantages.abs().sum()) > 0
    assert float(batch.batches["listener"].advantages.abs().sum()) > 0
    assert set(batch.metrics) >= {"reward/mean", "env/success", "policy/reward/mean", "listener/reward/mean",
                                  "listener/env/invalid_action_frac"}

    before = {n: [t.detach().clone() for t in lr.params] for n, lr in run.learner.learners.items()}
    row = run.learner.update(batch, 0)
    for name in ("policy", "listener"):
        # the rollout's own log-probs (old_log_probs=rollout) against the training forward: exactly equal
        assert row[f"{name}/ratio/first_max_abs_dev"].value == 0.0
        assert row[f"{name}/grad_norm"].value > 0.0
        after = run.learner.learners[name].params
        assert any(not torch.equal(a, b) for a, b in zip(before[name], after)), name
    assert row["listener/optim/lr"].value == pytest.approx(1e-4) and row["policy/optim/lr"].value == pytest.approx(1e-3)
    assert run.learner.learners["policy"].optimizer is not run.learner.learners["listener"].optimizer
    run.generator.close()


def test_a_shared_policy_plays_two_roles_at_once_with_role_prompts(tmp_path):
    node = OmegaConf.load(TEAM)
    del node.policies
    node.env = {"name": "matching", "rounds": 2, "max_turns": 2, "role_credit": "own",
        "roles": {"first": {"policy": "policy", "system_prompt": "You are player one."},
                  "second": {"policy": "policy", "system_prompt": "You are player two."}}}
    node.policy.format_prompt = "{prompt} Reply as <answer> word </answer>."
    path = tmp_path / "matching.yaml"
    OmegaConf.save(node, path)
    from mmrl.loop.trainer import setup

    run = setup(load_config(str(path), [f"output_dir={tmp_path / 'run'}", f"rewards=[{{name: '{REWARD}'}}]",
                                        "policy.old_log_probs=rollout"]))
    batch = run.generator.next_batch(0)
    assert set(batch.batches) == {"policy"}
    ro = batch.batches["policy"].rollout
    g = 4
    assert len(ro) == 2 * 2 * g                               # 2 seeds x 2 roles x G, one group per (seed, role)
    assert ro.group.tolist() == [k for k in range(4) for _ in range(g)]
    roles = [s.meta["role"] for s in ro.samples]
    assert roles == (["first"] * g + ["second"] * g) * 2
    tok = run.policy.p.model.tokenizer
    for s, views in zip(ro.samples, ro.state["views"]):
        assert s.meta["turns"] == 2                            # both act in both rounds
        seen = tok.decode(views[0].inputs.input_ids.flatten())  # what the role read: its system prompt first
        assert ("player one" in seen) == (s.meta["role"] == "first")
        assert ("player two" in seen) == (s.meta["role"] == "second")
        assert "Round 2 of 2. Last round:" in seen             # its second turn follows its first reply
    row = run.learner.update(batch, 0)
    assert row["policy/ratio/first_max_abs_dev"].value == 0.0
    run.generator.close()


def test_a_role_calls_tools_and_acts_after_their_results_in_the_same_turn(tmp_path, script):
    """The speaker's first reply in trajectories 0 and 2 of each group calls `lookup` (scripted; the others are the
    model's own): the environment waits, the result follows the call in the speaker's context, the speaker replies
    again and that reply is its message; the listener reads the message, never the call. Every trained token is a
    generated one (ratio exactly 1) and the calls are counted in the speaker's metrics."""
    import json

    from mmrl.episodes import EpisodeMeta

    tools = os.path.join(REPO, "tests", "vlm", "agent_tools.py") + ":lookup"
    run = team_run(tmp_path, f"tools=['{tools}']", "env.max_tool_calls=2", "policy.max_prompt_tokens=1024",
                   "policies.listener.policy.max_prompt_tokens=1024")
    speaker = run.learner.learners["policy"].policy
    calls = json.dumps({"name": "lookup", "arguments": {"key": "left"}})
    recorder = script(speaker, lambda k, i: f"<tool_call>\n{calls}\n</tool_call>" if k in (0, 2) and i in (0, 2)
                      else None)
    batch = run.generator.next_batch(0)
    assert [len(outs) for _, outs in recorder.calls] == [4, 2, 4, 2]   # per seed: the group, then the two callers
    ro = batch.batches["policy"].rollout
    listeners = batch.batches["listener"].rollout.samples
    tok = speaker.p.model.tokenizer
    for j, (s, heard, views) in enumerate(zip(ro.samples, listeners, ro.state["views"])):
        called = j % 4 in (0, 2)
        made = s.meta[EpisodeMeta.TOOL_CALLS]
        assert len(made) == len(s.meta[EpisodeMeta.ACTIONS]) == (2 if called else 1)
        if called:
            assert [c["result"] for c in made[0]] == ["go towards cell 0"] and made[0][0]["error"] is None
            assert s.meta[EpisodeMeta.ACTIONS][0] is None and s.meta[EpisodeMeta.INVALID] == 0
            seen = tok.decode(views[-1].inputs.input_ids)
            assert seen.index("</tool_call>") < seen.index("<tool_response>\ngo towards cell 0\n</tool_response>")
        message = " ".join(str(s.meta[EpisodeMeta.ACTIONS][-1] or "").split())[:200] or "(nothing)"
        assert f"Your partner's message: {message}" in heard.prompt and "tool_call" not in heard.prompt
    assert batch.metrics["policy/tools/lookup/calls"].value == 0.5     # per episode: 2 of each 4 call once
    assert batch.metrics["listener/tools/calls_per_episode"].value == 0
    row = run.learner.update(batch, 0)
    assert row["policy/ratio/first_max_abs_dev"].value == 0.0 and row["listener/ratio/first_max_abs_dev"].value == 0.0
    run.generator.close()
