"""The FrozenLake agent's pretraining pieces (shapes_world/pretrain_agent.py): the shortest-path teacher,
the per-cell probe targets, the teacher's walks, and the layout of an example, which must be the RL
adapter's memoryless turn token for token."""

import random

import numpy as np
import pytest
import torch

from shapes_world.pretrain_agent import EDGE, lake_state, probe_targets, shortest_moves


def _desc(rows):
    return np.array([[c.encode() for c in row] for row in rows], dtype="|S1")


def test_the_config_shows_the_instructions_the_tokenizer_was_built_for():
    from mmrl.config import load_config
    from shapes_world.agent_model import FORMAT_PROMPT, INSTRUCTIONS
    from shapes_world.pretrain_agent import CONFIG

    cfg = load_config(CONFIG, ["policy.model=tiny:qwen2_5_vl"])
    assert cfg.env.instructions == INSTRUCTIONS and cfg.policy.format_prompt == FORMAT_PROMPT
    assert cfg.env.history_turns == 0 and cfg.env.observation == "image"      # what the examples are laid out as


def test_shortest_moves_table():
    open_lake = _desc(["SFFF", "FFFF", "FFFF", "FFFG"])
    assert shortest_moves(open_lake, (0, 0)) == ["down", "right"]          # both start a shortest path
    assert shortest_moves(open_lake, (3, 0)) == ["right"]
    assert shortest_moves(open_lake, (3, 3)) == []                          # on the goal
    hole_below = _desc(["SFFF", "HFFF", "FFFF", "FFFG"])
    assert shortest_moves(hole_below, (0, 0)) == ["right"]
    right_column_blocked = _desc(["SFFF", "FFFH", "FFFH", "FFFG"])
    assert shortest_moves(right_column_blocked, (0, 3)) == ["left"]
    cornered = _desc(["SFFF", "FFFF", "FHHF", "FHFG"])                      # from (3, 0) the only way out is up
    assert shortest_moves(cornered, (3, 0)) == ["up"]
    walled = _desc(["SHFF", "HFFF", "FFFF", "FFFG"])
    assert shortest_moves(walled, (0, 0)) == []


def test_probe_targets_table():
    lake = _desc(["SHFF", "FFFF", "FFFH", "FFFG"])
    t = probe_targets(lake, (1, 1))
    assert t["tile"].tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2]   # ice 0, hole 1, goal 2
    assert t["player"].nonzero().flatten().tolist() == [5]                           # row-major: (1, 1)
    # neighbours in gymnasium's order left, down, right, up; EDGE beyond the lake
    assert t["near"][0].tolist() == [EDGE, 0, 1, EDGE]
    assert t["near"][5].tolist() == [0, 0, 0, 1]
    assert t["near"][15].tolist() == [0, EDGE, EDGE, 1]
    assert t["moves"][5].tolist() == [0, 1, 1, 0]                          # down or right from (1, 1)
    assert t["moves"][14].tolist() == [0, 0, 1, 0]                         # (3, 2): right onto the goal
    assert t["moves"][1].sum() == 0 and t["moves"][15].sum() == 0          # a hole, the goal


def test_walk_states_are_off_the_goal_and_holes_and_reproducible():
    got = [lake_state(seed, random.Random(seed)) for seed in range(40)]
    states = [s for s in got if s is not None]
    assert len(states) >= 30
    for s in states:
        assert s["moves"], "every state of a walk has a way to the goal"
        player = int(s["probe"]["player"].argmax())
        assert int(s["probe"]["tile"][player]) == 0                         # on ice, not a hole or the goal
    assert len({int(s["probe"]["player"].argmax()) for s in states}) > 5    # walks reach many cells
    again = lake_state(3, random.Random(3))
    assert again["moves"] == got[3]["moves"] and torch.equal(again["probe"]["player"], got[3]["probe"]["player"])


@pytest.fixture(scope="module")
def agent_policy(tmp_path_factory):
    from shapes_world.agent_model import build, save
    from shapes_world.pretrain_agent import make_policy

    folder = str(tmp_path_factory.mktemp("agent"))
    model, processor = build(seed=0)
    save(model, processor, folder)
    torch.set_num_threads(1)
    policy, cfg = make_policy(folder, 0)
    return policy, cfg, processor


def test_an_example_is_the_rl_adapters_memoryless_turn_token_for_token(agent_policy):
    from envs.frozenlake import FrozenLake
    from shapes_world.pretrain_agent import encode

    policy, cfg, processor = agent_policy
    obs, _ = FrozenLake(4).reset(seed=7)
    example = encode({"image": obs["image"]}, "down", processor)
    head = policy.episodes.start({"env_seed": 7}, 1)[0].context[0]             # what the agent sees at turn 0
    reply = example["labels"][example["labels"] != -100]
    assert torch.equal(example["input_ids"][:-reply.numel()], head.input_ids.flatten())
    assert processor.tokenizer.decode(reply) == "<answer>down</answer><|im_end|>"
    with torch.no_grad():                                                  # the same image, the same pixels
        feats = policy.p.model.hf.model.get_image_features(example["pixel_values"], example["image_grid_thw"])
    feats = getattr(feats, "pooler_output", feats)
    feats = torch.cat(list(feats)) if isinstance(feats, (list, tuple)) else feats
    assert torch.allclose(feats, torch.cat(list(head.features.pooled)), atol=1e-6)


def test_the_probe_reads_each_cells_token_and_trains_the_vision_tower(agent_policy):
    from shapes_world.pretrain_agent import Probe, encode, states
    from shapes_world.pretrain_vlm import collate

    from shapes_world.agent_model import build

    _, _, processor = agent_policy
    model, _ = build(seed=0)                        # phase 1 trains the vision tower (RL keeps it frozen)
    batch_states = states(range(4), random.Random(0))
    batch = collate([encode(s, s["moves"][0], processor) for s in batch_states], processor.tokenizer.pad_token_id)
    probe = Probe(model.config.vision_config.out_hidden_size)
    loss = probe.loss(model, batch, [s["probe"] for s in batch_states])
    loss.backward()
    assert torch.isfinite(loss) and loss > 0
    assert model.model.visual.patch_embed.proj.weight.grad.abs().sum() > 0


def test_biased_targets_table():
    from shapes_world.pretrain_agent import biased_targets

    got = biased_targets([{"moves": ["down"]}, {"moves": ["down", "right"]}, {"moves": ["left"]}], 0.6)
    # ACTIONS order: left, down, right, up; "right" is the biased teacher's default
    assert torch.allclose(got, torch.tensor([[0.0, 0.4, 0.6, 0.0], [0.0, 0.2, 0.8, 0.0], [0.4, 0.0, 0.6, 0.0]]))
    assert torch.allclose(biased_targets([{"moves": ["up"]}], 0.0), torch.tensor([[0.0, 0.0, 0.0, 1.0]]))


def test_move_log_probs_read_the_first_token_of_each_move_after_answer(agent_policy):
    from envs.frozenlake import ACTIONS, FrozenLake
    from shapes_world.pretrain_agent import encode, move_log_probs
    from shapes_world.pretrain_vlm import collate

    _, _, processor = agent_policy
    obs, _ = FrozenLake(4).reset(seed=1)
    batch = collate([encode({"image": obs["image"]}, m, processor) for m in ("up", "down")],
                    processor.tokenizer.pad_token_id)
    start = int((batch["labels"][0] != -100).nonzero()[0])             # the `<answer>` label
    tok = processor.tokenizer
    first = [tok(f"<answer>{m}</answer>", add_special_tokens=False)["input_ids"][1] for m in ACTIONS]
    logits = torch.randn(2, batch["input_ids"].shape[1], len(tok))
    got = move_log_probs(logits, batch["labels"], processor)
    assert torch.allclose(got, logits[:, start].log_softmax(-1)[:, first])
    assert int(batch["input_ids"][1, start + 1]) == first[ACTIONS.index("down")]   # that logit predicts the move
