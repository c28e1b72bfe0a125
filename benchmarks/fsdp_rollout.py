"""How a sharded run samples: `distributed.rollout: gathered` against `sharded`, 2 CPU processes (gloo).

gathered: every FSDP unit is all-gathered once before the rollout and freed after it; generation then
          runs without collectives (each rank decodes at its own pace).
sharded:  only the root's own weights are gathered; each block is gathered before each forward and
          freed after it, so HF generate steps the ranks in lockstep (synced_gpus) and a block is
          all-gathered once per decoding step.
Both train the same tiny configs (full fine-tuning, `distributed.strategy=fsdp`) for a few steps, each as a
torchrun subprocess, alternating A, B, A, B; reported: the median `time/rollout_s` over the steps after the
first, and the peak resident memory per process (`mem/peak_rss_bytes`, max over ranks).

    python benchmarks/fsdp_rollout.py [--repeats 2] [--steps 4] [--configs vlm_tiny,sd3_tiny]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [p for p in (HERE, REPO) if p not in sys.path]

from common import Report, machine, run, table  # noqa: E402

MODES = ("gathered", "sharded")


def _train(config: str, mode: str, steps: int, out: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone", "-m", "mmrl",
           "train", os.path.join(REPO, "configs", "tiny", f"{config}.yaml"), f"output_dir={out}",
           f"max_steps={steps}", "eval.every=0", "checkpoint.every=0", "logging.progress=false",
           "policy.lora.rank=0", "optim.lr=1e-4", "distributed.strategy=fsdp", f"distributed.rollout={mode}"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{config} {mode} failed:\n{done.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


def measure(args) -> Report:
    rows, ratios = [], []
    for config in args.configs.split(","):
        rollout = {m: [] for m in MODES}
        rss = {m: 0 for m in MODES}
        for r in range(args.repeats):
            for mode in MODES:
                with tempfile.TemporaryDirectory() as tmp:
                    metrics = _train(config, mode, args.steps, os.path.join(tmp, "run"))
                rollout[mode] += [m["time/rollout_s"] for m in metrics[1:]]
                rss[mode] = max(rss[mode], max(m["mem/peak_rss_bytes"] for m in metrics))
        med = {m: statistics.median(rollout[m]) for m in MODES}
        ratios.append(med["sharded"] / med["gathered"])
        for mode in MODES:
            rows.append([config, mode, f"{med[mode]:.3f}", f"{rss[mode] / 2**20:.0f}"])
    head = ["config", "distributed.rollout", "rollout s (median)", "peak RSS MiB / process"]
    text = table(f"FSDP rollouts, {machine()}", head, rows)
    pairs = ", ".join(f"{c} {r:.2f}" for c, r in zip(args.configs.split(","), ratios))
    return Report([text], f"rollout time sharded / gathered (2 CPU processes): {pairs}")


def add_options(ap) -> None:
    ap.set_defaults(repeats=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--configs", default="vlm_tiny,sd3_tiny")


if __name__ == "__main__":
    run(__doc__, add_options, measure)
