"""Long agent episodes: an agent step with the whole history kept, mmrl against the naive loop, on the same work.

The work: the rollout of one agent step, G trajectories of P environment seeds played for `--turns` replies each
(the tiny Qwen2.5-VL, random weights, sampling; tests/vlm/agent_env.py's corridor, long enough that no episode ends
early, an image of 16 tokens every turn), then every reply's log-probs (the old log-probs the update needs).

    mmrl    each trajectory keeps its KV cache across turns and prefills only the new tokens (policy.cache_turns,
            vlm/turn_cache.py); the group's first prompt is prefilled once; a trajectory is scored by one forward
            over its whole sequence (vlm/trajectory.py)
    naive   every turn prefills each trajectory's whole context again (policy.cache_turns=false), and each reply is
            scored on its own, as a single-turn completion of its context (one forward per reply)

Both play the same episodes from the same seeds (a different generation path may round a logit differently and
draw another token now and then; the table shows the share of equal replies). The log-probs of the replies both
sampled alike are compared: the packed forward against the per-reply one. Goal: mmrl / naive <= 0.5 at 8-16 turns.

    python benchmarks/agent_episodes.py [--repeats 3] [--turns 8,16]
"""

from __future__ import annotations

import os

import torch

from common import Report, interleaved, machine, median, run, table

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORRIDOR = os.path.join(REPO, "tests", "vlm", "agent_env.py") + ":Corridor"


def add_options(ap) -> None:
    ap.add_argument("--turns", default="8,16", help="comma-separated replies per episode")
    ap.add_argument("--seeds", type=int, default=2, help="environment seeds (P)")
    ap.add_argument("--group", type=int, default=4, help="trajectories per seed (G)")
    ap.add_argument("--new-tokens", type=int, default=12, help="policy.max_new_tokens")
    ap.add_argument("--pixels", type=int, default=12544, help="policy.min_pixels = max_pixels (12544: 16 image tokens "
                    "per observation, the FrozenLake recipe's)")


def build(turns: int, cache: bool, args, folder: str):
    from mmrl.config import EnvConfig
    from mmrl.config.policies import BuildContext
    from vlm.policy import Config, LoraSection
    from vlm.policy import build as build_policy

    env = EnvConfig(name=CORRIDOR, max_turns=turns, history_turns=None, kwargs={"length": 64})
    cfg = Config(model="tiny:qwen2_5_vl", min_pixels=args.pixels, max_pixels=args.pixels, max_prompt_tokens=16384,
                 max_new_tokens=args.new_tokens, logprob_chunk=16, lora=LoraSection(rank=8, alpha=16),
                 format_prompt="none", old_log_probs="rollout", cache_turns=cache)
    torch.manual_seed(0)
    return build_policy(cfg, BuildContext(device=torch.device("cpu"), seed=0, output_dir=folder, precision="fp32",
                                          env=env))


def naive_rollout(policy, batch, group: int):
    """The naive loop: re-prefill every turn (cache_turns off), then one scoring forward per reply. Returns the
    trajectories, each generate call's (context, reply tokens) and the per-reply log-probs."""
    from vlm.batch import layout_for

    log, real = [], policy.p.backend.sample_rows

    def recording(rows, spec, seeds, device):                 # each reply with the context it was drawn from
        outs = real(rows, spec, seeds, device)
        log.extend((x, tokens) for x, (tokens, _) in zip(rows, outs))
        return outs

    policy.p.backend.sample_rows = recording
    try:
        trajs = policy._episodes(batch, group, policy._sampling())
    finally:
        policy.p.backend.sample_rows = real
    with torch.no_grad():
        scores = [policy.scorer([x], [tokens], [layout_for([x], [tokens])], int(tokens.numel()))[0][0]
                  for x, tokens in log]
    return trajs, log, scores


def packed_vs_per_reply(policy, trajs, log, scores) -> float:
    """Max |packed - per reply| over every reply token: each trajectory's one-forward log-probs (vlm/trajectory.py)
    against the per-reply forwards of the naive loop, on the naive loop's own trajectories."""
    from vlm.trajectory import score_views

    width = max(t.actions_so_far for t in trajs)
    with torch.no_grad():
        packed, _ = score_views(policy.scorer, [t.views for t in trajs], width)          # [N, T]
    worst = 0.0
    for i, t in enumerate(trajs):
        ids = t.views[0].inputs.input_ids
        mine = [lp for (x, tokens), lp in zip(log, scores)                               # its replies, in order
                if len(x.input_ids) + len(tokens) <= len(ids)
                and torch.equal(ids[:len(x.input_ids) + len(tokens)], torch.cat([x.input_ids, tokens]))]
        per_reply = torch.cat(mine)                                                      # [T_i]
        worst = max(worst, float((packed[i, :per_reply.numel()] - per_reply).abs().max()))
    return worst


def measure(args) -> Report:
    import tempfile

    from mmrl.types import PromptBatch

    torch.set_num_threads(2)
    rows, ratios = [], {}
    with tempfile.TemporaryDirectory() as folder:
        for turns in [int(t) for t in args.turns.split(",")]:
            mmrl, naive = build(turns, True, args, folder), build(turns, False, args, folder)
            batch = PromptBatch(rows=[{"env_seed": s} for s in range(args.seeds)], index=list(range(args.seeds)),
                                seeds=[100 + s for s in range(args.seeds)], step=0)
            got = {}

            def step_mmrl():
                got["mmrl"] = mmrl.rollout(batch, args.group)

            def step_naive():
                got["naive"] = naive_rollout(naive, batch, args.group)

            times = interleaved({"mmrl": step_mmrl, "naive": step_naive}, repeats=args.repeats, warmup=1)
            ro, (trajs, log, scores) = got["mmrl"], got["naive"]
            ours, theirs = [s.meta["replies"] for s in ro.samples], [t.replies for t in trajs]
            same = sum(a == b for x, y in zip(ours, theirs) for a, b in zip(x, y))
            total = sum(len(x) for x in ours)
            assert all(len(x) == turns for x in ours), "an episode ended early: lengthen the corridor"
            worst = packed_vs_per_reply(naive, trajs, log, scores)
            tokens = int(ro.mask.sum())
            mm, nv = median(times["mmrl"]), median(times["naive"])
            ratios[turns] = mm / nv
            rows += [[turns, "mmrl", mm, tokens / mm, f"{same}/{total}", f"{worst:.1e}", mm / nv],
                     [turns, "naive", nv, tokens / nv, "", "", 1.0]]
    header = ["turns", "contender", "s per agent step", "reply tokens/s", "replies equal", "max |packed - per reply|",
              "/ naive"]
    title = (f"agent step, whole history, {args.seeds} seeds x {args.group} trajectories, up to {args.new_tokens} "
             f"tokens per reply, {args.pixels} pixels per image ({machine()}; median of {args.repeats})")
    headline = "mmrl / naive: " + ", ".join(f"{t} turns {r:.3f}" for t, r in ratios.items()) + " (goal <= 0.5)"
    return Report([table(title, header, rows)], headline)


if __name__ == "__main__":
    run(__doc__, add_options, measure, quiet=True)
