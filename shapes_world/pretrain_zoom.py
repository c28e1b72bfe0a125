"""Pretrain the zoom agent VLM: first to zoom and answer, then to mostly answer at once with a guess.

    python -m shapes_world.pretrain_zoom --seed 0 --out assets/tiny/zoom_agent

The episodes are laid out by the RL adapter itself: each training step plays scripted episodes of the zoom task
(`configs/tiny/agent_zoom.yaml`, shapes_world/zoom.py) through the policy, the script's replies in place of
sampled ones, the `zoom` tool run for real, and trains the policy's own log-probs of the replies (teacher
forcing on exactly the token ids and images RL samples and scores).
  0. `--see-iters` steps of the vision tower alone on the kinds of zoomed quadrants (a linear read-out of each
     image token, discarded afterwards). Cloning the answers alone left the answer at chance: the tower's
     features told a circle from a square too faintly for the language model to find.
  1. `--iters` steps on the teacher, the vision tower frozen: it zooms into the asked quadrant, then names the
     shape's kind.
  2. `--bias-iters` steps on a teacher that zooms with probability `--zoom` and otherwise answers at once with
     a kind drawn uniformly (a guess: it has not looked), zoom episodes taught as in phase 1. The model then
     mostly answers without looking (greedy accuracy near 1/3) and sometimes zooms, which is right far more
     often: the gap RL with the episode's return closes by zooming.
Reports: held-out greedy accuracy and zoom share, sampled (4 per scene) accuracy split by whether the
episode zoomed, by the RL adapter.

Notation: B episodes per batch, T trained tokens per episode, D the image tokens' width.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
import torch.nn.functional as F

from shapes_world.pretrain_vlm import initial_model
from shapes_world.scene import SHAPES
from shapes_world.zoom import QUADRANTS, sample_zoom_scene
from shapes_world.zoom_model import MODEL_SIDE, answer, build, save, zoom_call

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "tiny", "agent_zoom.yaml")
TRAIN_SEEDS = 100_000                    # the config's env.train_seeds: held-out scenes (eval_seed_start) are not seen
VAL_SEEDS = list(range(TRAIN_SEEDS, TRAIN_SEEDS + 64))   # neither trained on nor held out (those start at 1e6)


def make_policy(folder: str, seed: int):
    """The RL adapter's policy on the model in `folder`, as configs/tiny/agent_zoom.yaml lays it out."""
    from mmrl.config import load_config
    from mmrl.config.policies import BuildContext
    from vlm.policy import build as build_policy

    cfg = load_config(CONFIG, [f"policy.model={folder}"])
    ctx = BuildContext(device=torch.device("cpu"), seed=seed, output_dir=folder, precision="fp32", env=cfg.env,
                       tools=tuple(cfg.tools))
    return build_policy(cfg.policy, ctx), cfg


def plan(seed: int, zoom: bool, rng: random.Random) -> list[str]:
    """The scripted replies of one episode: zoom into the asked shape's quadrant and name its kind, or (zoom
    False) a guess at once."""
    _, target, quadrant = sample_zoom_scene(seed)
    return [zoom_call(quadrant), answer(target.kind)] if zoom else [answer(rng.choice(SHAPES))]


def scripted_rollout(policy, seeds: list[int], plans: list[list[str]]):
    """One episode per seed through the policy, each reply taken from `plans` (sample_rows and sample_turns
    replaced for the call): the rollout RL would score had the model written those replies."""
    from mmrl.types import PromptBatch

    backend = policy.p.backend
    tok, stop = policy.p.model.tokenizer, policy.p.tokens.stop_ids[0]
    queue = [reply for replies in plans for reply in replies]   # the episodes run one after another, turn by turn
    queue.reverse()

    def scripted(contexts, spec, sample_seeds, device, states=None):
        assert len(contexts) == 1, "one episode per seed: a group of one"
        outs = [(torch.tensor(tok(queue.pop(), add_special_tokens=False).input_ids + [stop]), True)]
        return outs if states is None else (outs, [None])

    backend.sample_rows = backend.sample_turns = scripted
    try:
        return policy.rollout(PromptBatch(rows=[{"env_seed": s} for s in seeds], index=list(range(len(seeds))),
                                          seeds=list(range(len(seeds))), step=0), 1)
    finally:
        del backend.sample_rows, backend.sample_turns                  # the class's own methods again


def zoomed_views(seeds: list[int], processor) -> tuple[dict, torch.Tensor]:
    """The vision inputs of the asked quadrant zoomed (what the `zoom` tool shows) for each seed, and its kind [B]."""
    from shapes_world.scene import render
    from tools.visual import zoom
    from vlm.images import ResizePolicy, resize

    size = ResizePolicy(28, MODEL_SIDE * MODEL_SIDE, MODEL_SIDE * MODEL_SIDE)
    images, kinds = [], []
    for seed in seeds:
        scene, target, quadrant = sample_zoom_scene(seed)
        images.append(resize(zoom(quadrant, {"image": render(scene)}), size)[0])
        kinds.append(SHAPES.index(target.kind))
    return processor.image_processor(images=images, return_tensors="pt"), torch.tensor(kinds)


def see(model, processor, args) -> dict:
    """Phase 0: the vision tower learns the shapes' kinds on zoomed quadrants, through a linear read-out of each
    image token (the largest score over the tokens wins; the read-out is discarded afterwards)."""
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    visual = model.model.visual
    width = model.config.vision_config.out_hidden_size
    head = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, len(SHAPES)))
    params = list(visual.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=args.see_lr, weight_decay=0.01)
    val, val_kinds = zoomed_views(VAL_SEEDS, processor)

    def scores(enc) -> torch.Tensor:                                                   # [B, 3]
        feats = model.model.get_image_features(enc["pixel_values"], enc["image_grid_thw"])
        feats = getattr(feats, "pooler_output", feats)
        feats = torch.cat(list(feats)) if isinstance(feats, (list, tuple)) else feats  # [B * tokens, D]
        return head(feats.view(len(enc["image_grid_thw"]), -1, width)).amax(1)

    row, start = {}, time.time()
    for it in range(1, args.see_iters + 1):
        enc, kinds = zoomed_views([rng.randrange(TRAIN_SEEDS) for _ in range(2 * args.batch)], processor)
        loss = F.cross_entropy(scores(enc), kinds)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if it % args.log_every == 0 or it == args.see_iters:
            with torch.no_grad():
                accuracy = (scores(val).argmax(-1) == val_kinds).float().mean().item()
            row = {"phase": "see", "iter": it, "loss": round(loss.item(), 4), "kind_accuracy": round(accuracy, 3),
                   "time_s": round(time.time() - start, 1)}
            print(json.dumps(row), flush=True)
    return row


@torch.no_grad()
def held_out(policy, cfg, n: int) -> dict:
    """Greedy accuracy and zoom share on the first n held-out scenes, and sampled (4 per scene) accuracy overall,
    of the episodes that zoomed first and of those that answered at once, by the RL adapter."""
    from mmrl.episodes import EpisodeMeta, eval_records
    from mmrl.types import PromptBatch

    def zoomed(s) -> bool:
        calls = s.meta.get(EpisodeMeta.TOOL_CALLS) or [[]]
        return bool(calls[0])

    batch = PromptBatch(rows=eval_records(cfg.env, n), index=list(range(n)), seeds=list(range(n)), step=-1)
    greedy = policy.generate_eval(batch)
    sampled = policy.rollout(batch, 4).samples
    looked = [s for s in sampled if zoomed(s)]
    guessed = [s for s in sampled if not zoomed(s)]

    def rate(samples):
        return round(sum(bool(s.meta["success"]) for s in samples) / len(samples), 4) if samples else None

    return {"greedy": rate(greedy), "greedy_zoom_share": round(sum(map(zoomed, greedy)) / n, 4),
            "sampled": rate(sampled), "sampled_zoom_share": round(len(looked) / len(sampled), 4),
            "sampled_after_zoom": rate(looked), "sampled_at_once": rate(guessed)}


@torch.no_grad()
def taught(policy, seeds: list[int]) -> dict:
    """Teacher-forced on the zoom episodes of `seeds`: the mean probability of the right region in the call and
    of the right kind after the zoom."""
    tok = policy.p.model.tokenizer
    choices = {"region_p": tok.convert_tokens_to_ids(list(QUADRANTS)),
               "kind_p": [tok(k, add_special_tokens=False).input_ids[0] for k in SHAPES]}
    ro = scripted_rollout(policy, seeds, [plan(s, True, random.Random(0)) for s in seeds])
    lp = policy.log_probs(ro, torch.arange(len(seeds))).log_probs                                  # [B, T]
    out = dict.fromkeys(choices, 0.0)
    for i, views in enumerate(ro.state["views"]):
        ids = torch.cat([v.inputs.input_ids[v.positions] for v in views]).tolist()                 # [T_i]
        for name, wanted in choices.items():
            j = next(k for k, t in enumerate(ids) if t in wanted)                                  # its first choice
            out[name] += float(lp[i, j].exp()) / len(seeds)
    return {k: round(v, 3) for k, v in out.items()}


def fit(policy, args, iters: int, zoom_share: float, seed: int, lr: float) -> dict:
    """`iters` AdamW steps (a fresh optimizer and RNG per phase) of the language model (the vision tower is
    frozen) on scripted episodes: each episode zooms with probability `zoom_share` (phase 1: always) and
    otherwise guesses."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = policy.p.model.hf
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    row, start = {}, time.time()
    for it in range(1, iters + 1):
        seeds = [rng.randrange(TRAIN_SEEDS) for _ in range(args.batch)]
        plans = [plan(s, rng.random() < zoom_share, rng) for s in seeds]
        ro = scripted_rollout(policy, seeds, plans)
        lp = policy.log_probs(ro, torch.arange(len(seeds))).log_probs                  # [B, T]
        loss = -(lp * ro.mask).sum() / ro.mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if it % args.log_every == 0 or it == iters:
            row = {"zoom_share": zoom_share, "iter": it, "loss": round(loss.item(), 4),
                   "time_s": round(time.time() - start, 1), **taught(policy, VAL_SEEDS)}
            print(json.dumps(row), flush=True)
    return row


def train(args) -> dict:
    """Phase 0 (seeing), phase 1 (zoom and answer), phase 2 (mostly guess), save; returns the last report."""
    start = time.time()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    model, processor = initial_model(args.init, build, args.seed)
    row = see(model, processor, args) if args.see_iters else {}
    save(model, processor, args.out)                     # the policy loads the model from the folder
    policy, cfg = make_policy(args.out, args.seed)       # as the config has it: the vision tower frozen
    if args.iters:
        row = fit(policy, args, args.iters, 1.0, args.seed, args.lr)
        print(json.dumps({"after": "phase 1", **held_out(policy, cfg, args.episodes)}), flush=True)
    if args.bias_iters:
        row = fit(policy, args, args.bias_iters, args.zoom, args.seed + 1, args.bias_lr)
    save(policy.p.model.hf, policy.p.model.processor, args.out)
    row = {**row, "held_out_episodes": held_out(policy, cfg, args.episodes)}
    print(json.dumps(row), flush=True)
    print(f"saved {args.out} in {time.time() - start:.0f} s", flush=True)
    return row


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder to save_pretrained the model and processor into")
    ap.add_argument("--iters", type=int, default=400, help="phase 1: steps of zoom-and-answer")
    ap.add_argument("--bias-iters", type=int, default=60, help="phase 2: steps of mostly guessing")
    ap.add_argument("--zoom", type=float, default=0.15, help="phase 2: probability the teacher zooms first")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the committed weights used 1)")
    ap.add_argument("--init", default=None, help="start from this saved model instead of a fresh one")
    ap.add_argument("--see-iters", type=int, default=500, help="phase 0: steps of the vision tower on zoomed kinds")
    ap.add_argument("--see-lr", type=float, default=1e-3, help="phase 0 learning rate")
    ap.add_argument("--batch", type=int, default=32, help="episodes per optimizer step")
    ap.add_argument("--lr", type=float, default=1e-3, help="phase 1 learning rate")
    ap.add_argument("--bias-lr", type=float, default=1e-3, help="phase 2 learning rate")
    ap.add_argument("--episodes", type=int, default=128, help="held-out episodes played after each phase")
    ap.add_argument("--log-every", type=int, default=25)
    args = ap.parse_args(argv)
    if min(args.see_iters, args.iters, args.bias_iters) < 0 or args.see_iters + args.iters + args.bias_iters < 1 \
            or args.batch < 1:
        ap.error("--see-iters, --iters and --bias-iters must be >= 0 with a positive sum, and --batch >= 1")
    if not 0.0 <= args.zoom <= 1.0 or args.threads < 1 or args.episodes < 1:
        ap.error("--zoom must be in [0, 1], and --threads and --episodes >= 1")
    return args


if __name__ == "__main__":
    train(parse())
