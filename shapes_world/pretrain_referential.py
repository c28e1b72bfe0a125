"""Pretrain the referential game's speaker and listener together into imperfect starts.

    python -m shapes_world.pretrain_referential --seed 0 --out assets/tiny

writes `referential_speaker` and `referential_listener` under `--out` (about 13 minutes on one CPU thread). The
rounds are laid out by the RL adapter itself: each step of phases 1 and 2 plays scripted rounds of the game
(`configs/tiny/referential_game.yaml`, shapes_world/referential.py) through the two policies as a team
(`vlm.roles.Team`), the script's replies in place of sampled ones, and trains each policy's own log-probs of its
replies (teacher forcing on exactly the token ids and images RL samples and scores).
  0. `--see-iters` steps: the listener's vision tower learns each candidate panel's colour and position (its
     shade) through a linear read-out of the panel's image token (the read-out is then discarded). Both vision
     towers are frozen from here on, as RL keeps them (`freeze_vision`).
  1. `--iters` steps on the teacher: the speaker names the target's colour; the listener restates the message,
     then answers the number of the candidate of that colour (`red <answer>3</answer>`). Answering at once stayed
     at chance for hundreds of steps: finding the named colour among the panels is a two-step circuit that the
     restated colour turns into one step per token. The first `--easy-iters` steps, and every other step after
     them, show the listener the target alone (the other panels empty), so it first learns which panel is which.
  2. `--vague-iters` steps at `--vague-lr` on an imperfect teacher: the speaker names the colour with probability
     `--say`, else says "a shape"; the listener follows a colour with probability `--follow` (else, and after
     "a shape", it answers a uniformly drawn number). The team then mostly fails to communicate: the greedy
     speaker says "a shape" and the listener guesses (held-out success near 1/4), while a sampled speaker sometimes
     names the colour, which the listener mostly follows: the gap RL with the team's reward closes.
Reports: teacher-forced probabilities on validation rounds, then held-out greedy and sampled success by the RL
adapter, split by whether the message named the target's colour.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
import torch.nn.functional as F

from shapes_world.referential import sample_round
from shapes_world.referential_model import LISTENER_PIXELS, VAGUE, answer, build, save

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "tiny", "referential_game.yaml")
TRAIN_SEEDS = 100_000                    # the config's env.train_seeds: held-out rounds (eval_seed_start) are not seen
VAL_SEEDS = list(range(TRAIN_SEEDS, TRAIN_SEEDS + 64))   # neither trained on nor held out (those start at 1e6)
NAMES = {"speaker": "referential_speaker", "listener": "referential_listener"}


def make_team(out: str, seed: int, train_vision: bool):
    """(team, config): the RL adapter's two policies on the models under `out`, as the config lays them out
    (`train_vision`: the vision towers train too)."""
    from envs import make_env
    from mmrl.config import load_config
    from mmrl.config.policies import BuildContext
    from mmrl.roles import roles_of
    from vlm.policy import build as build_policy, build_team

    frozen = str(not train_vision).lower()
    cfg = load_config(CONFIG, [f"policy.model={os.path.join(out, NAMES['speaker'])}",
                               f"policies.listener.policy.model={os.path.join(out, NAMES['listener'])}",
                               f"policy.freeze_vision={frozen}", f"policies.listener.policy.freeze_vision={frozen}"])
    ctx = BuildContext(device=torch.device("cpu"), seed=seed, output_dir=out, precision="fp32", env=cfg.env)
    policies = {"policy": build_policy(cfg.policy, ctx), "listener": build_policy(cfg.policies["listener"].policy, ctx)}
    env = make_env(cfg.env.name, dict(cfg.env.kwargs))
    return build_team(policies, roles_of(cfg, env), cfg.env, torch.device("cpu")), cfg


def plan(seed: int, k: int, say: bool, follow: bool, rng: random.Random) -> tuple[str, str]:
    """(the speaker's message, the listener's reply) of one scripted round. The listener restates the message
    before its answer (`red <answer>3</answer>`): the token before the number then carries the colour to look for.
    Answering at once stayed at chance for hundreds of steps (fetching the colour and matching it against the
    panels is a two-step circuit with no first-order gradient)."""
    shapes, target = sample_round(seed, k)
    if not say:
        return VAGUE, f"{VAGUE} {answer(rng.randint(1, k))}"
    colour = shapes[target].color
    return colour, f"{colour} {answer(target + 1 if follow else rng.randint(1, k))}"


def scripted_rollout(team, seeds: list[int], plans: list[tuple[str, str]]) -> dict:
    """One round per seed through the team, each role's reply taken from `plans` (its policy's sample_rows replaced
    for the call): policy name -> the Rollout RL would score had the models written those replies."""
    from mmrl.types import PromptBatch

    queues = {"policy": [m for m, _ in plans][::-1], "listener": [a for _, a in plans][::-1]}

    def scripted(name):
        policy = team.policies[name]
        tok, stop = policy.p.model.tokenizer, policy.p.tokens.stop_ids[0]

        def sample_rows(contexts, spec, sample_seeds, device):
            assert len(contexts) == 1, "one round per seed: a group of one"
            return [(torch.tensor(tok(queues[name].pop(), add_special_tokens=False).input_ids + [stop]), True)]
        return sample_rows

    for name, policy in team.policies.items():
        policy.p.backend.sample_rows = scripted(name)
    try:
        return team.rollout(PromptBatch(rows=[{"env_seed": s} for s in seeds], index=list(range(len(seeds))),
                                        seeds=list(range(len(seeds))), step=0), 1)
    finally:
        for policy in team.policies.values():
            del policy.p.backend.sample_rows                      # the class's own method again


def panel_views(seeds: list[int], k: int, processor) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The listener's vision inputs of each seed's candidates (as the game shows them, resized as the policy shows
    them: one image token per panel), each panel's colour [B, K] and the panel index [B, K]."""
    from shapes_world.referential import candidates_image
    from shapes_world.scene import COLORS
    from vlm.images import ResizePolicy, resize

    size = ResizePolicy(28, LISTENER_PIXELS, LISTENER_PIXELS)
    images, colours = [], []
    for seed in seeds:
        shapes, _ = sample_round(seed, k)
        images.append(resize(candidates_image(shapes), size)[0])
        colours.append([list(COLORS).index(s.color) for s in shapes])
    panels = torch.arange(k).expand(len(seeds), k)
    size_kwargs = {"size": {"shortest_edge": LISTENER_PIXELS, "longest_edge": LISTENER_PIXELS}}
    return processor.image_processor(images=images, return_tensors="pt", **size_kwargs), torch.tensor(colours), panels


def see(model, processor, k: int, iters: int, lr: float, batch: int, seed: int, log_every: int) -> dict:
    """The listener's vision tower learns each panel token's colour and panel (its shade) through a linear read-out
    of the token (discarded afterwards): the two things the listener's answer reads from a candidate."""
    from shapes_world.scene import COLORS

    torch.manual_seed(seed)
    rng = random.Random(seed)
    visual = model.model.visual
    width = model.config.vision_config.out_hidden_size
    head = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, len(COLORS) + k))
    params = list(visual.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    val = panel_views(VAL_SEEDS, k, processor)

    def scores(enc) -> torch.Tensor:                                                   # [B, K, colours + K]
        feats = model.model.get_image_features(enc["pixel_values"], enc["image_grid_thw"])
        feats = getattr(feats, "pooler_output", feats)
        feats = torch.cat(list(feats)) if isinstance(feats, (list, tuple)) else feats  # [B * K, D]
        return head(feats.view(len(enc["image_grid_thw"]), k, width))

    def loss_of(enc, colours, panels):
        out = scores(enc)
        c = len(COLORS)
        return (F.cross_entropy(out[..., :c].flatten(0, 1), colours.flatten())
                + F.cross_entropy(out[..., c:].flatten(0, 1), panels.flatten())), out

    row, start = {}, time.time()
    for it in range(1, iters + 1):
        enc, colours, panels = panel_views([rng.randrange(TRAIN_SEEDS) for _ in range(batch)], k, processor)
        loss, _ = loss_of(enc, colours, panels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if it % log_every == 0 or it == iters:
            with torch.no_grad():
                _, out = loss_of(*val)
            c = len(COLORS)
            row = {"phase": "see", "iter": it, "loss": round(loss.item(), 4),
                   "colour_accuracy": round(float((out[..., :c].argmax(-1) == val[1]).float().mean()), 3),
                   "panel_accuracy": round(float((out[..., c:].argmax(-1) == val[2]).float().mean()), 3),
                   "time_s": round(time.time() - start, 1)}
            print(json.dumps(row), flush=True)
    return row


@torch.no_grad()
def taught(team, k: int) -> dict:
    """Teacher-forced on informative validation rounds: the speaker's mean probability of the target's colour and
    the listener's of the target's number."""
    seeds = VAL_SEEDS
    ro = scripted_rollout(team, seeds, [plan(s, k, True, True, random.Random(0)) for s in seeds])
    out = {}
    for name, key in (("policy", "speaker_p"), ("listener", "listener_p")):
        policy = team.policies[name]
        lp = policy.log_probs(ro[name], torch.arange(len(seeds))).log_probs                         # [B, T]
        tok = policy.p.model.tokenizer
        if name == "policy":                                       # the message's first token: the colour
            out[key] = round(float(lp[:, 0].exp().mean()), 3)
            continue
        after = tok.convert_tokens_to_ids("<answer>")              # the number follows the answer tag
        total = 0.0
        for i, views in enumerate(ro[name].state["views"]):
            ids = torch.cat([v.inputs.input_ids[v.positions] for v in views]).tolist()
            total += float(lp[i, ids.index(after) + 1].exp())
        out[key] = round(total / len(seeds), 3)
    return out


def fit(team, k: int, iters: int, say: float, follow: float, seed: int, lr: float, batch: int, log_every: int,
        easy: int = 0):
    """`iters` AdamW steps of both policies (a fresh optimizer and RNG per phase) on scripted rounds; the first
    `easy` steps, and every odd step after them, show the listener the target alone (the other panels empty)."""
    import dataclasses

    full = team.runner.env_cfg
    empty = dataclasses.replace(full, kwargs={**full.kwargs, "distractors": False})
    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = {n: [p for p in pol.p.model.hf.parameters() if p.requires_grad] for n, pol in team.policies.items()}
    opts = {n: torch.optim.AdamW(ps, lr=lr, weight_decay=0.01) for n, ps in params.items()}
    row, start = {}, time.time()
    for it in range(1, iters + 1):
        team.runner.env_cfg = empty if easy and (it <= easy or it % 2) else full
        seeds = [rng.randrange(TRAIN_SEEDS) for _ in range(batch)]
        plans = [plan(s, k, rng.random() < say, rng.random() < follow, rng) for s in seeds]
        rollouts = scripted_rollout(team, seeds, plans)
        losses = {}
        for name, policy in team.policies.items():
            ro = rollouts[name]
            lp = policy.log_probs(ro, torch.arange(len(seeds))).log_probs                          # [B, T]
            loss = -(lp * ro.mask).sum() / ro.mask.sum()
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params[name], 1.0)
            opts[name].step()
            losses[name] = round(loss.item(), 4)
        if it % log_every == 0 or it == iters:
            team.runner.env_cfg = full
            row = {"say": say, "follow": follow, "iter": it, "loss": losses, "time_s": round(time.time() - start, 1),
                   **taught(team, k)}
            print(json.dumps(row), flush=True)
    team.runner.env_cfg = full
    return row


@torch.no_grad()
def held_out(team, cfg, n: int) -> dict:
    """Greedy and sampled (4 per round) team success on the first n held-out rounds, by the RL adapter, with the
    share of messages that name the target's colour and the success of those that do and do not."""
    from mmrl.episodes import eval_records
    from mmrl.types import PromptBatch
    from shapes_world.referential import sample_round as round_of

    k = int(cfg.env.kwargs.get("candidates", 4))
    rows = eval_records(cfg.env, n)
    batch = PromptBatch(rows=rows, index=list(range(n)), seeds=list(range(n)), step=-1)

    def colour(seed: int) -> str:
        shapes, target = round_of(seed, k)
        return shapes[target].color

    def split(pairs):                                  # (speaker sample, listener sample) -> report
        named = [(s, lis) for s, lis in pairs if colour(s.meta["env_seed"]) in s.output.split()]
        rate = (lambda ps: round(sum(bool(lis.meta["success"]) for _, lis in ps) / len(ps), 3) if ps else None)
        vague = [p for p in pairs if p not in named]
        return {"success": rate(pairs), "named_share": round(len(named) / len(pairs), 3), "success_named": rate(named),
                "success_vague": rate(vague)}

    greedy = team.generate_eval(batch)
    out = {"greedy": split(list(zip(greedy[0::2], greedy[1::2])))}
    sampled = team.rollout(batch, 4)
    out["sampled"] = split(list(zip(sampled["policy"].samples, sampled["listener"].samples)))
    out["greedy_messages"] = sorted({s.output for s in greedy[0::2]})[:8]
    return out


def train(args) -> dict:
    """Build both models, phase 0 (the listener's panels), phase 1 (the teacher), phase 2 (the imperfect teacher),
    save; returns the last report."""
    start = time.time()
    torch.set_num_threads(args.threads)
    for offset, role in enumerate(("speaker", "listener")):
        model, processor = build(args.seed * 2 + offset)
        if role == "listener" and args.see_iters:
            see(model, processor, 4, args.see_iters, args.see_lr, args.batch, args.seed, args.log_every)
        save(model, processor, os.path.join(args.out, NAMES[role]))
    team, cfg = make_team(args.out, args.seed, train_vision=False)
    k = int(cfg.env.kwargs.get("candidates", 4))
    row = {}
    if args.iters:
        row = fit(team, k, args.iters, 1.0, 1.0, args.seed, args.lr, args.batch, args.log_every, args.easy_iters)
        print(json.dumps({"after": "phase 1", **held_out(team, cfg, args.episodes)}), flush=True)
    if args.vague_iters:
        row = fit(team, k, args.vague_iters, args.say, args.follow, args.seed + 1, args.vague_lr, args.batch,
                  args.log_every)
    for name, role in (("policy", "speaker"), ("listener", "listener")):
        policy = team.policies[name]
        save(policy.p.model.hf, policy.p.model.processor, os.path.join(args.out, NAMES[role]))
    team, cfg = make_team(args.out, args.seed, train_vision=False)      # as RL loads them
    row = {**row, "held_out": held_out(team, cfg, args.episodes)}
    print(json.dumps(row), flush=True)
    print(f"saved {args.out} in {time.time() - start:.0f} s", flush=True)
    return row


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder to save the two models into (referential_speaker/, "
                                                 "referential_listener/)")
    ap.add_argument("--see-iters", type=int, default=150, help="phase 0: the listener's vision tower on panels")
    ap.add_argument("--see-lr", type=float, default=1e-3, help="phase 0 learning rate")
    ap.add_argument("--iters", type=int, default=1000, help="phase 1: steps on the teacher")
    ap.add_argument("--easy-iters", type=int, default=100, help="phase 1: first steps with the other panels empty "
                                                                "(then every other step)")
    ap.add_argument("--vague-iters", type=int, default=210, help="phase 2: steps on the imperfect teacher")
    ap.add_argument("--say", type=float, default=0.2, help="phase 2: probability the speaker names the colour")
    ap.add_argument("--follow", type=float, default=0.8, help="phase 2: probability the listener follows a colour")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the committed weights used 1)")
    ap.add_argument("--batch", type=int, default=32, help="rounds per optimizer step")
    ap.add_argument("--lr", type=float, default=1e-3, help="phase 1 learning rate")
    ap.add_argument("--vague-lr", type=float, default=3e-4, help="phase 2 learning rate")
    ap.add_argument("--episodes", type=int, default=128, help="held-out rounds played after each phase")
    ap.add_argument("--log-every", type=int, default=25)
    args = ap.parse_args(argv)
    if min(args.see_iters, args.iters, args.easy_iters, args.vague_iters) < 0 or args.batch < 1 \
            or args.iters + args.vague_iters < 1:
        ap.error("--see-iters, --iters, --easy-iters and --vague-iters must be >= 0, --iters + --vague-iters >= 1, "
                 "and --batch >= 1")
    if not (0.0 <= args.say <= 1.0 and 0.0 <= args.follow <= 1.0) or args.threads < 1 or args.episodes < 1:
        ap.error("--say and --follow must be in [0, 1], and --threads and --episodes >= 1")
    return args


if __name__ == "__main__":
    train(parse())
