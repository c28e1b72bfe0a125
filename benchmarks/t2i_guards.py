"""Guards against reward hacking on the text-to-image CPU default, measured against a blind verifier.

Each row trains `configs/tiny/t2i_shapes_grpo.yaml` (the policy-gradient recipe) with the old, blind
`shapes_t2i` (it only looks at the asked colour's blobs, so painting the background costs nothing) and the
setup that recipe had before it learned to keep the background clean (DanceGRPO SDE on a random 60% of all
8 steps, lr 2e-4, no KL), then adds one guard. It reports the held-out blind reward and the
stray-background fraction (`shapes_stray`, a diagnostic, never trained on) at step 0 and at the end: a
guard works when the stray fraction stays near its start while the reward still rises.

    python benchmarks/t2i_guards.py [--seeds 0 1] [--steps 50] [--jobs 2] [--only none,kl]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "tiny", "t2i_shapes_grpo.yaml")
BLIND = ["rewards=[{name: shapes_t2i, blind: true}]", "eval.diagnostics=[{name: shapes_stray}]",
         "policy.sde_schedule=dance_grpo", "policy.noise_level=0.5",
         "policy.timesteps={select: fraction, fraction: 0.6}", "optim.lr=2e-4", "algo.kl_beta=0.0",
         "algo.clip_low=1e-4", "algo.clip_high=1e-4", "train.ema_decay=0.0", "policy.lora.rank=0",
         "policy.reference=false", "optim.warmup_steps=0", "optim.schedule=constant"]
GUARDS = {
    "none": [],
    "kl": ["algo.kl_beta=0.1", "policy.reference=true"],
    "ratio_norm+step_reweight": ["algo.policy_loss=grpo_guard", "algo.step_reweight=true",
                                 "algo.clip_low=1e-5", "algo.clip_high=1e-5"],
    "ema": ["train.ema_decay=0.9"],
    "cps": ["policy.sde_schedule=cps", "policy.noise_level=0.8"],
    "early_sde_window": ["policy.timesteps={select: window, window_size: 4, window_stride: 0}"],
    "all_of_the_above": ["algo.kl_beta=0.1", "policy.reference=true", "train.ema_decay=0.9",
                         "policy.timesteps={select: window, window_size: 4, window_stride: 0}"],
}


def run(guard: str, seed: int, steps: int, out: str) -> dict:
    run_dir = os.path.join(out, f"{guard}_seed{seed}")
    cmd = [sys.executable, "-m", "mmrl", "train", CONFIG, f"output_dir={run_dir}", f"seed={seed}",
           f"max_steps={steps}", f"eval.every={steps}", "logging.progress=false", *BLIND, *GUARDS[guard]]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    if done.returncode != 0:
        raise RuntimeError(f"{guard} seed {seed} failed:\n{done.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        evals = [r for r in map(json.loads, f) if "eval/reward/mean" in r]
    first, last = evals[0], evals[-1]
    return {"guard": guard, "seed": seed, "reward": (first["eval/reward/mean"], last["eval/reward/mean"]),
            "stray": (first["eval/quality/shapes_stray"], last["eval/quality/shapes_stray"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated guard names (default: all)")
    ap.add_argument("--out", default="", help="run directories (default: a temporary folder)")
    args = ap.parse_args()
    names = [g for g in args.only.split(",") if g] or list(GUARDS)
    unknown = sorted(set(names) - set(GUARDS))
    if unknown:
        ap.error(f"unknown guard(s) {', '.join(unknown)}; valid: {', '.join(GUARDS)}")
    out = args.out or tempfile.mkdtemp(prefix="mmrl_guards_")
    jobs = [(g, s) for g in names for s in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda j: run(j[0], j[1], args.steps, out), jobs))
    print(f"blind shapes_t2i, {args.steps} steps; runs in {out}")
    print("| guard | seed | blind reward step 0 -> end | stray fraction step 0 -> end |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['guard']} | {r['seed']} | {r['reward'][0]:.3f} -> {r['reward'][1]:.3f} "
              f"({r['reward'][1] - r['reward'][0]:+.3f}) | {r['stray'][0]:.3f} -> {r['stray'][1]:.3f} |")


if __name__ == "__main__":
    main()
