"""Multi-turn episodes of the VLM adapter on a tiny random Qwen2.5-VL and a user environment loaded from
a file reference (tests/vlm/agent_env.py): trajectory layout, masks, ratio 1, zero gradient on
observation tokens, turn limits, invalid actions, history windows, seeds."""

from __future__ import annotations

import os

import pytest
import torch

from mmrl.config import ENV_KEYS, EnvConfig
from mmrl.episodes import EpisodeMeta
from mmrl.config.policies import BuildContext
from mmrl.types import PromptBatch, select
from vlm.episodes import extract_action

ENV_FILE = os.path.join(os.path.dirname(__file__), "agent_env.py") + ":Corridor"


@pytest.fixture
def agent(tmp_path):
    """agent(env_fields..., policy=dict(...)) -> a VLM policy running Corridor episodes."""
    from vlm.policy import Config, LoraSection, build

    def make(policy: dict | None = None, **env_fields):
        own = {k: v for k, v in env_fields.items() if k in ENV_KEYS}
        env = EnvConfig(**{"name": ENV_FILE, "max_turns": 3, **own},
                        kwargs={k: v for k, v in env_fields.items() if k not in ENV_KEYS})
        fields = dict(model="tiny:qwen2_5_vl", min_pixels=784, max_pixels=3136, max_prompt_tokens=1024,
                      max_new_tokens=4, logprob_chunk=4, lora=LoraSection(rank=0), format_prompt="none",
                      old_log_probs="rollout")
        fields.update(policy or {})
        torch.manual_seed(0)
        return build(Config(**fields), BuildContext(device=torch.device("cpu"), seed=0, output_dir=str(tmp_path),
                                                  precision="fp32", env=env))

    return make


def batch(seeds=(3, 4), step=0) -> PromptBatch:
    return PromptBatch(rows=[{"env_seed": s} for s in seeds], index=list(range(len(seeds))),
                       seeds=[100 + i for i in range(len(seeds))], step=step)


def test_trajectories_are_one_sample_each_with_the_replies_as_actions(agent):
    policy = agent(max_turns=3)
    ro = policy.rollout(batch(), 3)
    assert len(ro) == 6 and ro.group.tolist() == [0, 0, 0, 1, 1, 1]
    for i, s in enumerate(ro.samples):
        m = s.meta
        assert 1 <= m[EpisodeMeta.TURNS] <= 3 and len(m[EpisodeMeta.REPLIES]) == m[EpisodeMeta.TURNS]
        assert m[EpisodeMeta.RETURN] == pytest.approx(sum(m[EpisodeMeta.TURN_REWARDS]))
        assert int(ro.mask[i].sum()) == m["num_tokens"]                    # actions = the replies' tokens only
        assert m[EpisodeMeta.TERMINATED] or m[EpisodeMeta.TRUNCATED]
        views = ro.state["views"][i]
        assert len(views) == 1                                              # whole history: one forward
        v = views[0]
        # the view's action tokens are exactly the replies, in order
        ids = v.inputs.input_ids[v.positions]
        text = policy.p.model.tokenizer.decode(ids, skip_special_tokens=True)
        assert text.replace("\n", "") == "".join(m[EpisodeMeta.REPLIES]).replace("\n", "")
        # every observation image is in the sequence once: 1 + turns - 1 images (no image after the last reply)
        assert len(v.inputs.images) == m[EpisodeMeta.TURNS]
    # the G trajectories of a group share their first observation
    assert ro.samples[0].prompt == ro.samples[1].prompt


def test_on_policy_ratio_is_exactly_one_on_multi_turn_trajectories_with_images(agent):
    policy = agent(max_turns=3)
    ro = policy.rollout(batch(), 3)
    assert ro.log_probs is not None and ro.mask.sum() > 6
    for idx in (torch.tensor([5, 0, 3]), torch.tensor([1]), torch.tensor([2, 4])):   # other microbatches
        new = policy.log_probs(ro, idx).log_probs
        assert torch.equal(new.detach() * ro.mask[idx], ro.log_probs[idx] * ro.mask[idx])


def test_scored_log_probs_are_those_of_each_reply_given_its_context(agent):
    """The one-forward view scores every reply as if it were a single-turn completion of its context."""
    from vlm.batch import layout_for

    policy = agent(max_turns=3)
    ro = policy.rollout(batch((5,)), 2)
    for i in range(len(ro)):
        segments = ro.state["views"][i][0]
        inputs = segments.inputs
        column = 0
        starts = segments.positions
        # split the action positions into the replies (contiguous runs)
        runs = torch.tensor_split(starts, (torch.nonzero(starts.diff() != 1).squeeze(1) + 1).tolist())
        for run in runs:
            lo, hi = int(run[0]), int(run[-1]) + 1
            ctx = type(inputs)(inputs.input_ids[:lo], {k: v[:lo] for k, v in inputs.token_inputs.items()},
                               inputs.image_inputs, {}, "", [], [], inputs.row, features=inputs.features)
            ctx = _trim_images(ctx, inputs, int((ctx.input_ids == policy.p.tokens.image_token_id).sum()))
            comp = inputs.input_ids[lo:hi]
            layout = layout_for([ctx], [comp])
            lp, _ = policy.scorer([ctx], [comp], [layout], hi - lo)
            assert torch.allclose(lp[0], ro.log_probs[i, column:column + hi - lo], atol=1e-5)
            column += hi - lo


def _trim_images(ctx, full, n_tokens):
    """The context's share of the view's images (the images before position `lo`)."""
    from vlm.features import Encoded

    pooled, kept = [], 0
    for t in full.features.pooled:
        if kept + t.shape[0] > n_tokens:
            break
        pooled.append(t)
        kept += t.shape[0]
    grid = {k: v[:len(pooled)] for k, v in full.image_inputs.items()}
    return type(ctx)(ctx.input_ids, ctx.token_inputs, grid, {}, "", [], [], ctx.row,
                     features=Encoded(full.features.output_cls, tuple(pooled)))


def test_observation_tokens_receive_exactly_zero_gradient(agent):
    policy = agent(max_turns=3)
    ro = policy.rollout(batch((5,)), 2)
    captured = {}

    def keep(module, args, out):                    # the hidden states [R, W, H] under the LM head
        out.last_hidden_state.retain_grad()
        captured["last"] = out.last_hidden_state

    hook = policy.p.model.hf.model.register_forward_hook(keep)
    try:
        for i in range(len(ro)):                         # one view per trajectory: one forward each
            scores = policy.log_probs(ro, torch.tensor([i]))
            (scores.log_probs * ro.mask[[i]]).sum().backward()
            grad = captured["last"].grad[0]                                  # [W, H]
            v = ro.state["views"][i][0]
            offset = v.layout.width - v.inputs.input_ids.numel()
            predicts_action = torch.zeros(grad.shape[0], dtype=torch.bool)
            predicts_action[v.positions + offset - 1] = True               # hidden at p-1 predicts token p
            assert float(grad[~predicts_action].abs().max()) == 0.0         # observation / template tokens: 0
            assert bool((grad[predicts_action].abs().sum(-1) > 0).all())    # every model token gets a gradient
    finally:
        hook.remove()


def test_max_turns_ends_an_episode_as_truncated(agent):
    policy = agent(max_turns=2, length=50)       # the corridor is too long to finish
    ro = policy.rollout(batch(), 2)
    for s in ro.samples:
        assert s.meta[EpisodeMeta.TURNS] == 2 and s.meta[EpisodeMeta.TRUNCATED]
        assert not s.meta[EpisodeMeta.TERMINATED] and not s.meta[EpisodeMeta.SUCCESS]


def test_environment_truncation_and_termination_end_the_episode(agent):
    policy = agent(max_turns=5, length=50, truncate_after=1)
    for s in policy.rollout(batch(), 2).samples:
        assert s.meta[EpisodeMeta.TURNS] == 1 and s.meta[EpisodeMeta.TRUNCATED]
    policy = agent(max_turns=6, length=2)           # start in cell 0 of 2: one step right finishes
    ro = policy.rollout(batch(), 4)
    finished = [s for s in ro.samples if s.meta[EpisodeMeta.TERMINATED]]
    assert finished, "some random replies should walk right"
    for s in finished:
        assert s.meta[EpisodeMeta.SUCCESS] and s.meta[EpisodeMeta.TURN_REWARDS][-1] == 1.0
        assert not s.meta[EpisodeMeta.TRUNCATED]


def test_an_unparseable_action_gets_the_configured_reward_and_the_episode_goes_on(agent):
    policy = agent(max_turns=3, invalid_action_reward=-0.5, length=50, policy={"format_prompt": "r1"})
    ro = policy.rollout(batch(), 2)                   # a random model never writes <answer> tags
    for s in ro.samples:
        assert s.meta[EpisodeMeta.TURNS] == 3
        assert s.meta[EpisodeMeta.TURN_REWARDS] == [-0.5] * 3 and s.meta[EpisodeMeta.INVALID] == 3
        assert s.meta[EpisodeMeta.ACTIONS] == [None] * 3
    strict = agent(max_turns=2, invalid_action_reward=-0.25, length=50, strict=True)   # env says invalid
    for s in strict.rollout(batch(), 2).samples:
        assert s.meta[EpisodeMeta.TURN_REWARDS] == [-0.25, -0.25] and s.meta[EpisodeMeta.INVALID] == 2


def test_extract_action_table():
    assert extract_action("<think>x</think><answer> right </answer>", True) == "right"
    assert extract_action("<answer>a</answer> then <answer>b</answer>", True) == "b"
    assert extract_action("right", True) is None
    assert extract_action("<answer>  </answer>", True) is None
    assert extract_action("  up ", False) == "up"
    assert extract_action("   ", False) is None


def test_a_history_window_scores_each_reply_in_its_own_context(agent):
    policy = agent(max_turns=4, length=50, history_turns=1)
    ro = policy.rollout(batch((7,)), 2)
    for i, s in enumerate(ro.samples):
        views = ro.state["views"][i]
        assert s.meta[EpisodeMeta.TURNS] == 4 and len(views) == 3          # turns 1-2 share a view, then one each
        # a window of one turn: the instructions with the previous observation, the last reply, the current one
        assert [v.positions.numel() for v in views] == [sum(s.meta[EpisodeMeta.TURN_TOKENS][:2]),
                                                       *s.meta[EpisodeMeta.TURN_TOKENS][2:]]
        cols = [(v.column, v.column + v.positions.numel()) for v in views]
        assert cols[0][0] == 0 and all(a[1] == b[0] for a, b in zip(cols, cols[1:]))
        assert cols[-1][1] == int(ro.mask[i].sum())
        assert all(len(v.inputs.images) <= 2 for v in views)                 # head + one kept turn's image
    new = policy.log_probs(ro, torch.tensor([1, 0])).log_probs
    assert torch.equal(new.detach() * ro.mask[[1, 0]], ro.log_probs[[1, 0]] * ro.mask[[1, 0]])


def test_trajectories_depend_on_the_seeds_only_not_on_the_other_groups(agent):
    policy = agent(max_turns=3)
    both = policy.rollout(batch((3, 4)), 2)
    second = policy.rollout(PromptBatch(rows=[{"env_seed": 4}], index=[1], seeds=[101]), 2)
    assert [s.output for s in both.samples[2:]] == [s.output for s in second.samples]
    assert torch.equal(both.log_probs[2:, :second.log_probs.shape[1]], second.log_probs)
    part = select(both, torch.tensor([2, 3]))
    assert [s.meta for s in part.samples] == [s.meta for s in second.samples]


def test_greedy_evaluation_plays_one_episode_per_seed(agent):
    policy = agent(max_turns=2)
    out = policy.generate_eval(PromptBatch(rows=[{"env_seed": 1000}, {"env_seed": 1001}], index=[0, 1],
                                           seeds=[0, 1], step=-1))
    again = policy.generate_eval(PromptBatch(rows=[{"env_seed": 1000}, {"env_seed": 1001}], index=[0, 1],
                                             seeds=[5, 6], step=-1))
    assert len(out) == 2 and [s.output for s in out] == [s.output for s in again]
    assert all(EpisodeMeta.SUCCESS in s.meta for s in out)


def test_the_lora_base_is_the_kl_reference_of_a_trajectory(agent):
    policy = agent(max_turns=2, policy={"lora": __import__("vlm.policy", fromlist=["LoraSection"]).LoraSection(rank=4, alpha=8)})
    ro = policy.rollout(batch((3,)), 2)
    idx = torch.arange(len(ro))
    ref = policy.reference_log_probs(ro, idx).log_probs
    assert torch.equal(ref * ro.mask, policy.log_probs(ro, idx).log_probs.detach() * ro.mask)   # LoRA B starts at 0


@pytest.mark.parametrize("credit", ["turn_index", "state"])
def test_turn_level_credit_reaches_the_update(credit, tmp_path, repo_root):
    import json

    from omegaconf import OmegaConf

    from mmrl.config import load_config
    from mmrl.loop.trainer import setup

    node = OmegaConf.load(os.path.join(repo_root, "configs", "tiny", "agent_tiny.yaml"))
    node.env = {"name": ENV_FILE, "length": 3, "max_turns": 4, "step_reward": -0.1}
    path = tmp_path / "corridor.yaml"
    OmegaConf.save(node, path)
    cfg = load_config(str(path), [f"output_dir={tmp_path / 'run'}", "max_steps=2", "eval.every=0",
                                  "checkpoint.every=0", f"algo.credit.name={credit}", "algo.credit.gamma=0.9",
                                  "algo.filter.name=none", "policy.format_prompt=none", "train.group_size=8",
                                  "train.samples_per_microbatch=16"])
    run = setup(cfg)
    batch = run.generator.next_batch(0)
    per_action = batch.action_advantages                                       # [N, T]
    assert per_action is not None and per_action.shape == batch.rollout.mask.shape
    varies = [i for i, s in enumerate(batch.rollout.samples) if len(set(s.meta["turn_tokens"])) >= 1
              and len(set((per_action[i] * batch.rollout.mask[i])[batch.rollout.mask[i] > 0].tolist())) > 1]
    assert varies, "turn-level credit gave every token of every trajectory one value"
    run.fit()
    run.accelerator.end_training()
    rows = [json.loads(line) for line in open(os.path.join(cfg.output_dir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [1, 2] and all(r["ratio/first_max_abs_dev"] == 0.0 for r in rows)


def test_every_turn_of_every_trajectory_draws_its_own_numbers():
    """torch's CPU generator keys on a seed's low 32 bits: turn seeds must differ there."""
    from vlm.episodes import turn_seed

    firsts = {float(torch.rand(1, generator=torch.Generator().manual_seed(turn_seed(s, j, t))))
              for s in (0, 1) for j in range(4) for t in range(8)}
    assert len(firsts) == 2 * 4 * 8
    assert turn_seed(5, 1, 2) == turn_seed(5, 1, 2) and 0 <= turn_seed(5, 1, 2) < 2**63


def test_sampled_replies_vary_across_turns(agent):
    policy = agent(max_turns=6, length=50)
    ro = policy.rollout(batch((3,)), 4)
    assert any(len(set(s.meta[EpisodeMeta.REPLIES])) > 1 for s in ro.samples)


def test_a_memoryless_agent_sees_the_instructions_and_the_current_observation_only(agent):
    """history_turns=0: each reply is generated from the task text and the current observation alone (one
    view per turn), and every observation image is encoded once, when it arrives."""
    from vlm.features import base_model

    policy = agent(max_turns=4, length=50, history_turns=0)
    vision = base_model(policy.p.model.hf)
    calls = []
    original = vision.get_image_features
    vision.get_image_features = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        ro = policy.rollout(batch((7,)), 2)
    finally:
        vision.get_image_features = original
    turns = [s.meta[EpisodeMeta.TURNS] for s in ro.samples]
    assert len(calls) == 1 + sum(t - 1 for t in turns)          # the shared first observation, then one per new one
    for i, s in enumerate(ro.samples):
        views = ro.state["views"][i]
        assert len(views) == s.meta[EpisodeMeta.TURNS] and all(len(v.inputs.images) == 1 for v in views)
        assert all(v.positions.numel() == n for v, n in zip(views, s.meta[EpisodeMeta.TURN_TOKENS]))
    new = policy.log_probs(ro, torch.tensor([1, 0])).log_probs
    assert torch.equal(new.detach() * ro.mask[[1, 0]], ro.log_probs[[1, 0]] * ro.mask[[1, 0]])


@pytest.mark.parametrize("history_turns", [None, 1, 0])
def test_a_samples_images_are_the_observations_in_order_whatever_the_history_window(agent, history_turns):
    """Sample.images (the episode strip of evaluation) starts at the first observation, not at the first
    observation of the last history window."""
    import numpy as np

    from envs import make_env

    policy = agent(max_turns=4, length=50, history_turns=history_turns)
    ro = policy.rollout(batch((7,)), 2)
    for s in ro.samples:
        env = make_env(ENV_FILE, {"length": 50}, "env.name")
        obs, _ = env.reset(seed=7)
        expected = [obs["image"]]
        for action in s.meta[EpisodeMeta.ACTIONS][:-1]:             # an invalid action leaves the env as it is
            obs = env.step(action)[0] if action is not None else obs
            expected.append(obs["image"])
        assert len(s.images) == s.meta[EpisodeMeta.TURNS] == len(expected) > 1
        for shown, want in zip(s.images, expected):                  # as the model was shown it (resized)
            assert np.array_equal(np.asarray(shown), np.asarray(policy.episodes.template._image(want)))
