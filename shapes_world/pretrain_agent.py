"""Pretrain the FrozenLake agent VLM on a teacher's moves, then on a biased teacher's.

    python -m shapes_world.pretrain_agent --seed 0 --out assets/tiny/frozenlake_agent

The agent of `configs/tiny/agent_frozenlake.yaml` is memoryless (`env.history_turns: 0`): each turn it
sees the instructions and the current lake only. So one training example is one lake state: a map of a
TRAINING seed with the player on a cell a walk of the teacher reached, laid out exactly as the RL adapter
lays out that turn (same chat template, format prompt and image size; a test compares the ids), and the
teacher's reply `<answer>move</answer><|im_end|>`. The teacher plays a move of a shortest path to the
goal (breadth-first search over the map, ties drawn at random).

Perception: an image token carries what is in its cell, not where the cell is (rotary positions steer
attention, they are not in the values), and cloning the moves alone stayed at the moves' marginal for
thousands of steps. So phase 1 also trains the vision tower through a linear probe on each cell's image
token (discarded afterwards): the cell's tile, whether the player is on it, the tile (or the lake's edge)
in each of the four directions, and the teacher's moves from it. The language model then only has to
find the player's token and read it.
  1. `--iters` steps of moves and probes on the true teacher;
  2. `--bias-iters` steps on a teacher that says DEFAULT ("right") with probability `--bias` instead of
     its move (no probe): the agent then prefers "right" where the path turns down, so greedy play rarely
     reaches the goal while sampled play sometimes does, the deficit RL with the episode's return removes.
Reports: teacher-forced accuracy of the move on states of unseen maps (a move of any shortest path
counts) and greedy / sampled success of episodes on held-out seeds, played by the RL adapter.

Notation: B examples per batch, L padded sequence length, C = 16 cells, K probe outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import deque

import torch
import torch.nn.functional as F

from envs.frozenlake import ACTIONS, FrozenLake
from shapes_world.agent_model import FORMAT_PROMPT, INSTRUCTIONS, MODEL_SIDE, build, save
from shapes_world.pretrain_vlm import IGNORE, answer_position, collate, initial_model
from vlm.images import ResizePolicy, resize
from vlm.prompts import build_messages, format_text
from vlm.turns import as_image

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "tiny",
                      "agent_frozenlake.yaml")
MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}   # gymnasium's order, as ACTIONS
DEFAULT = "right"
SIZE, TRAIN_SEEDS = 4, 100000
TILE = {b"S": 0, b"F": 0, b"H": 1, b"G": 2}            # ice, hole, goal; EDGE = 3 beyond the lake
EDGE = 3
EXPLORE, WALK = 0.3, 10                                # the walks' share of random safe moves, their length


def goal_distances(desc) -> dict[tuple[int, int], int]:
    """Moves from each cell to the goal over cells that are not holes (breadth-first from the goal)."""
    rows, cols = desc.shape
    goal = next((r, c) for r in range(rows) for c in range(cols) if bytes(desc[r, c]) == b"G")
    dist, queue = {goal: 0}, deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < rows and 0 <= nxt[1] < cols and nxt not in dist and bytes(desc[nxt]) != b"H":
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return dist


def shortest_moves(desc, start: tuple[int, int], dist: dict | None = None) -> list[str]:
    """Every first move of a shortest path from `start` to the goal avoiding holes ([] when there is none)."""
    dist = goal_distances(desc) if dist is None else dist
    if start not in dist or dist[start] == 0:
        return []
    here = dist[start]
    return [name for name, (dr, dc) in MOVES.items() if dist.get((start[0] + dr, start[1] + dc)) == here - 1]


def probe_targets(desc, player: tuple[int, int]) -> dict[str, torch.Tensor]:
    """Per cell (row-major, as the image tokens): tile [C], player [C], tile or EDGE in each direction [C, 4],
    the teacher's moves from it [C, 4] (multi-hot)."""
    rows, cols = desc.shape
    dist = goal_distances(desc)
    tile, near, moves = torch.zeros(rows * cols, dtype=torch.long), torch.zeros(rows * cols, 4, dtype=torch.long), \
        torch.zeros(rows * cols, 4)
    for r in range(rows):
        for c in range(cols):
            k = r * cols + c
            tile[k] = TILE[bytes(desc[r, c])]
            for d, (dr, dc) in enumerate(MOVES.values()):
                rr, cc = r + dr, c + dc
                near[k, d] = TILE[bytes(desc[rr, cc])] if 0 <= rr < rows and 0 <= cc < cols else EDGE
            for name in shortest_moves(desc, (r, c), dist):
                moves[k, ACTIONS.index(name)] = 1.0
    player_hot = torch.zeros(rows * cols)
    player_hot[player[0] * cols + player[1]] = 1.0
    return {"tile": tile, "player": player_hot, "near": near, "moves": moves}


def lake_state(seed: int, rng: random.Random) -> dict | None:
    """One state of map `seed`: a walk from the start (teacher moves, and with probability EXPLORE a random
    move onto a cell that is not a hole) stopped at a random length, before the goal; None when the map has
    no path."""
    env = FrozenLake(SIZE)
    obs, _ = env.reset(seed=seed)
    dist = goal_distances(env.desc)
    player = env.player
    if player not in dist:
        return None
    for _ in range(rng.randrange(WALK)):
        safe = [m for m, (dr, dc) in MOVES.items() if (player[0] + dr, player[1] + dc) in dist]
        move = rng.choice(safe) if rng.random() < EXPLORE else rng.choice(shortest_moves(env.desc, player, dist))
        after, _, done, _, _ = env.step(move)
        if done:                                                          # the goal: keep the state before it
            break
        obs, player = after, env.player
    return {"image": obs["image"], "moves": shortest_moves(env.desc, player, dist),
            "probe": probe_targets(env.desc, player)}


def encode(state: dict, move: str, processor) -> dict:
    """One state and reply -> model inputs with labels on the reply only (the RL adapter's memoryless turn)."""
    image, _ = resize(as_image(state["image"]), ResizePolicy(28, MODEL_SIDE * MODEL_SIDE, MODEL_SIDE * MODEL_SIDE))
    messages = build_messages(format_text(INSTRUCTIONS, FORMAT_PROMPT), 1, None)
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], images=[image], return_tensors="pt")
    tok = processor.tokenizer
    reply = torch.tensor(tok(f"<answer>{move}</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    prompt = enc["input_ids"][0]                                                     # [Lp]
    return {"input_ids": torch.cat([prompt, reply]),                                 # [L]
            "mm_token_type_ids": torch.cat([enc["mm_token_type_ids"][0], torch.zeros_like(reply)]),
            "labels": torch.cat([torch.full_like(prompt, IGNORE), reply]),
            "pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}


class Probe(torch.nn.Module):
    """A linear read-out of each cell's image token: tile (3), player (1), four neighbours (4 x 4), moves (4)."""

    def __init__(self, width: int):
        super().__init__()
        self.linear = torch.nn.Linear(width, 3 + 1 + 16 + 4)

    def loss(self, model, batch: dict, targets: list[dict]) -> torch.Tensor:
        feats = model.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"])
        feats = getattr(feats, "pooler_output", feats)
        feats = torch.cat(list(feats)) if isinstance(feats, (list, tuple)) else feats
        out = self.linear(feats.view(len(targets), SIZE * SIZE, -1))                 # [B, C, K]
        t = {k: torch.stack([x[k] for x in targets]) for k in targets[0]}
        return (F.cross_entropy(out[..., :3].reshape(-1, 3), t["tile"].flatten())
                + F.binary_cross_entropy_with_logits(out[..., 3], t["player"])
                + F.cross_entropy(out[..., 4:20].reshape(-1, 4), t["near"].flatten())
                + F.binary_cross_entropy_with_logits(out[..., 20:], t["moves"]))


def states(seeds, rng: random.Random) -> list[dict]:
    return [s for s in (lake_state(seed, rng) for seed in seeds) if s is not None and s["moves"]]


def move_log_probs(logits: torch.Tensor, labels: torch.Tensor, processor) -> torch.Tensor:
    """[B, 4] log-probabilities (over the whole vocabulary) of the first token of each move, in ACTIONS order,
    where the reply's move starts (the logits [B, L, V] at the `<answer>` label predict it)."""
    tok = processor.tokenizer
    first = [tok(f"<answer>{m}</answer>", add_special_tokens=False)["input_ids"][1] for m in ACTIONS]
    pos = answer_position(labels)                                                              # [B]
    return logits[torch.arange(len(pos)), pos].float().log_softmax(-1)[:, first]               # [B, 4]


def biased_targets(batch_states: list[dict], bias: float) -> torch.Tensor:
    """[B, 4] the biased teacher's move distribution: DEFAULT with probability `bias`, else one of the
    teacher's moves (uniform among ties)."""
    out = torch.zeros(len(batch_states), len(ACTIONS))
    for i, s in enumerate(batch_states):
        for m in s["moves"]:
            out[i, ACTIONS.index(m)] += (1.0 - bias) / len(s["moves"])
        out[i, ACTIONS.index(DEFAULT)] += bias
    return out


@torch.no_grad()
def move_accuracy(model, processor, val: list[dict]) -> float:
    """Teacher-forced greedy move on held-out states: right when it starts a shortest path."""
    model.eval()
    batch = collate([encode(s, s["moves"][0], processor) for s in val], processor.tokenizer.pad_token_id)
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits                # [B, L, V]
    guess = move_log_probs(logits, batch["labels"], processor).argmax(-1)                      # [B]
    model.train()
    return round(sum(ACTIONS[int(g)] in s["moves"] for g, s in zip(guess, val)) / len(val), 4)


@torch.no_grad()
def held_out(policy, cfg, n: int) -> dict:
    """Greedy and sampled (4 per seed) success of episodes on the first n held-out seeds, by the RL adapter."""
    from mmrl.episodes import eval_records
    from mmrl.types import PromptBatch

    batch = PromptBatch(rows=eval_records(cfg.env, n), index=list(range(n)), seeds=list(range(n)), step=-1)
    greedy = policy.generate_eval(batch)
    sampled = policy.rollout(batch, 4).samples
    return {"greedy": round(sum(s.meta["success"] for s in greedy) / n, 4),
            "sampled": round(sum(s.meta["success"] for s in sampled) / len(sampled), 4)}


def make_policy(folder: str, seed: int):
    """The RL adapter's policy on the model in `folder`, as configs/tiny/agent_frozenlake.yaml lays it out."""
    from mmrl.config import load_config
    from mmrl.config.policies import BuildContext
    from vlm.policy import build as build_policy

    cfg = load_config(CONFIG, [f"policy.model={folder}"])
    ctx = BuildContext(device=torch.device("cpu"), seed=seed, output_dir=folder, precision="fp32", env=cfg.env)
    return build_policy(cfg.policy, ctx), cfg


def fit(model, processor, probe, val: list, args, iters: int, bias: float, seed: int, lr: float) -> dict:
    """`iters` AdamW steps (a fresh optimizer and RNG per phase): with the probe, phase 1 on the true teacher;
    without it, phase 2 on the biased teacher: the move's first token against the teacher's move distribution
    (a cross-entropy against the mixture, not against a sampled move: sampled moves at this learning rate
    wiped out what the move depends on, the agent said "down" as often where the path goes right as where it
    turns down), the reply's other tokens teacher-forced on a sampled move (without them "r" began to follow
    "r" too)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = list(model.parameters()) + (list(probe.parameters()) if probe is not None else [])
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    pad, row, start = processor.tokenizer.pad_token_id, {}, time.time()
    model.train()
    for it in range(1, iters + 1):
        batch_states = states([rng.randrange(TRAIN_SEEDS) for _ in range(args.batch)], rng)
        said = [DEFAULT if rng.random() < bias else rng.choice(s["moves"]) for s in batch_states]
        batch = collate([encode(s, m, processor) for s, m in zip(batch_states, said)], pad)
        if probe is not None:                    # phase 1: the teacher's reply, token by token, and the probes
            loss = model(**batch).loss + probe.loss(model, batch, [s["probe"] for s in batch_states])
        else:                                    # phase 2: the biased teacher's move distribution, exactly
            rest = batch["labels"].clone()       # the reply's other tokens, teacher-forced on a sampled move
            rest[torch.arange(len(said)), answer_position(rest) + 1] = IGNORE
            out = model(**{**batch, "labels": rest})
            target = biased_targets(batch_states, bias)                                       # [B, 4]
            loss = out.loss - (target * move_log_probs(out.logits, batch["labels"], processor)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if it % args.log_every == 0 or it == iters:
            row = {"bias": bias, "iter": it, "loss": round(loss.item(), 4), "time_s": round(time.time() - start, 1),
                   "move_accuracy": move_accuracy(model, processor, val)}
            print(json.dumps(row), flush=True)
    return row


def train(args) -> dict:
    """Phase 1 (true teacher, probes), phase 2 (biased teacher), save; returns the last report."""
    start = time.time()
    torch.set_num_threads(args.threads)
    model, processor = initial_model(args.init, build, args.seed)
    val = states(range(TRAIN_SEEDS, TRAIN_SEEDS + args.val), random.Random(-1))   # maps no phase trains on
    row = {}
    if args.iters:
        torch.manual_seed(args.seed)                                     # the probe's initial weights
        probe = Probe(model.config.vision_config.out_hidden_size)
        row = fit(model, processor, probe, val, args, args.iters, 0.0, args.seed, args.lr)
    if args.bias_iters:
        row = fit(model, processor, None, val, args, args.bias_iters, args.bias, args.seed + 1, args.bias_lr)
    save(model, processor, args.out)
    policy, cfg = make_policy(args.out, args.seed)
    row = {**row, "held_out_episodes": held_out(policy, cfg, args.episodes)}
    print(json.dumps(row), flush=True)
    print(f"saved {args.out} in {time.time() - start:.0f} s", flush=True)
    return row


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder to save_pretrained the model and processor into")
    ap.add_argument("--iters", type=int, default=600, help="phase 1: steps on the true teacher, with the probes")
    ap.add_argument("--bias-iters", type=int, default=100, help="phase 2: steps on the biased teacher")
    ap.add_argument("--bias", type=float, default=0.6, help="phase 2: probability the teacher says 'right'")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the committed weights used 1)")
    ap.add_argument("--init", default=None, help="start from this saved model instead of a fresh one")
    ap.add_argument("--batch", type=int, default=64, help="lake states per optimizer step")
    ap.add_argument("--lr", type=float, default=3e-3, help="phase 1 learning rate")
    ap.add_argument("--bias-lr", type=float, default=1e-3, help="phase 2 learning rate (3e-3 erased what the "
                    "move depends on)")
    ap.add_argument("--val", type=int, default=256, help="maps of validation states (not trained on)")
    ap.add_argument("--episodes", type=int, default=64, help="held-out episodes played at the end")
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args(argv)
    if args.iters < 0 or args.bias_iters < 0 or args.iters + args.bias_iters < 1 or args.batch < 1:
        ap.error("--iters and --bias-iters must be >= 0 with a positive sum, and --batch >= 1")
    if not 0.0 <= args.bias <= 1.0 or args.threads < 1 or args.val < 1 or args.episodes < 1:
        ap.error("--bias must be in [0, 1], and --threads, --val and --episodes >= 1")
    return args


if __name__ == "__main__":
    train(parse())
