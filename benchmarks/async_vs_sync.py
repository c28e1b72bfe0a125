"""Wall time per step and held-out reward: the synchronous trainer against asynchronous training on Ray.

Each workload trains the same config three ways, in turn inside one loop (sync, async eta=1, async eta=2), each as
its own `mmrl train` process, so a slow patch of the machine hits all three:

    vlm            the VLM CPU default (configs/tiny/vlm_shapes.yaml)
    agent_latency  the agent CPU default (configs/tiny/agent_frozenlake.yaml) whose environment step waits 50 ms
                   (benchmarks/latency.py:SlowFrozenLake), as a sandbox or a web tool does
    reward_latency the VLM CPU default with a second reward that waits 0.3 s per batch and weighs 0
                   (benchmarks/latency.py:judge_latency), as a judge served over HTTP does

The asynchronous runs use `asynchronous.rollout_workers` workers (default 2), `algo.objective=decoupled` and
`on_stale=pace`; the mode "async eta=1 +reward worker" adds one reward worker (`asynchronous.reward_workers=1`,
no CPU reserved: a judge's client waits), which scores while the rollout workers sample the next plans.

Per run: the mean seconds per step after the first two (the mean: asynchronous steps alternate between a batch
waited for and one already finished), the held-out reward at the last step, and where the time goes (sync:
rollout and rewards vs update; async: the learner's and the generators' idle fractions, weight sync). A step's
time is `time/rollout_s + time/update_s`: the evaluation at the last step is left out (in an asynchronous run
`time/rollout_s` is the learner's wait for its batch). Headline: async (eta=1) / sync seconds per step on the
latency-bound workloads (goal <= 0.6 at a held-out reward within noise of sync).

    python benchmarks/async_vs_sync.py [--steps 20] [--workloads vlm,agent_latency,reward_latency] [--workers 2]
                                       [--modes "sync,async eta=1,async eta=2,async eta=1 +reward worker"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from common import Report, machine, run, table  # noqa: E402

LATENCY = os.path.join(HERE, "latency.py")
WORKLOADS = {
    "vlm": ("configs/tiny/vlm_shapes.yaml", []),
    "agent_latency": ("configs/tiny/agent_frozenlake.yaml", [f"env.name={LATENCY}:SlowFrozenLake", "env.latency_s=0.05"]),
    "reward_latency": ("configs/tiny/vlm_shapes.yaml",
                       ["rewards=[{name: shapes_vlm}, {name: '" + LATENCY + ":judge_latency', weight: 0.0, "
                        "label: judge, latency_s: 0.3}]"]),
}
MODES = {"sync": [], "async eta=1": ["asynchronous.max_staleness=1"], "async eta=2": ["asynchronous.max_staleness=2"],
         # the rollout workers only sample; a reward worker without a CPU of its own (it waits on the judge) scores
         "async eta=1 +reward worker": ["asynchronous.max_staleness=1", "asynchronous.reward_workers=1",
                                        "asynchronous.cpus_per_reward_worker=0"]}


def options(ap: argparse.ArgumentParser) -> None:
    ap.set_defaults(repeats=1)                   # each run trains a CPU default: minutes
    ap.add_argument("--steps", type=int, default=20, help="training steps per run (held-out eval at 0 and the end)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    ap.add_argument("--workers", type=int, default=2, help="rollout workers of the asynchronous runs")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: " + ", ".join(MODES))


def train(config: str, overrides: list[str], out: str) -> list[dict]:
    cmd = [sys.executable, "-m", "mmrl", "train", os.path.join(REPO, config), f"output_dir={out}",
           "logging.progress=false", *overrides]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def summarize(rows: list[dict]) -> dict:
    steps = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval/reward/mean" in r]
    # a step's training time without its evaluation: waiting for (sync: making) the batch, then the update
    # the mean, not the median: asynchronous steps alternate (a batch waited for, then one already finished)
    out = {"s/step": statistics.mean(r["time/rollout_s"] + r["time/update_s"] for r in steps[2:] or steps),
           "eval start": evals[0]["eval/reward/mean"], "eval end": evals[-1]["eval/reward/mean"]}
    mean = lambda key: statistics.mean(r[key] for r in steps if key in r) if any(key in r for r in steps) else None  # noqa: E731
    out.update({"rollout s": mean("time/rollout_s"), "update s": mean("time/update_s"),
                "learner idle": mean("async/learner_idle_frac"), "generators idle": mean("async/generator_idle_frac"),
                "sync s": mean("async/weight_sync_s"), "staleness": mean("async/staleness/mean")})
    return out


def measure(args: argparse.Namespace) -> Report:
    names = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"--workloads: unknown {unknown}; valid: {', '.join(WORKLOADS)}")
    modes = [m for m in args.modes.split(",") if m]
    if sorted(set(modes) - set(MODES)) or "sync" not in modes:
        raise SystemExit(f"--modes: {modes} must name modes of {', '.join(MODES)}, sync among them")
    common = [f"max_steps={args.steps}", f"eval.every={args.steps}", "checkpoint.every=0"]
    asynchronous = ["asynchronous.enabled=true", f"asynchronous.rollout_workers={args.workers}",
                    "algo.objective=decoupled"]                      # a mode's own overrides come after
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for w in names:
                config, extra = WORKLOADS[w]
                for mode, mode_extra in ((m, MODES[m]) for m in modes):
                    over = common + extra + (asynchronous + mode_extra if mode != "sync" else [])
                    out = os.path.join(tmp, f"{w}_{mode.replace(' ', '_')}_{repeat}")
                    results.setdefault((w, mode), []).append(summarize(train(config, over, out)))
    rows, ratios = [], {}
    for (w, mode), runs in results.items():
        merged = {k: (statistics.median(r[k] for r in runs) if runs[0][k] is not None else None) for k in runs[0]}
        sync = statistics.median(r["s/step"] for r in results[(w, "sync")])
        ratio = merged["s/step"] / sync
        if mode == "async eta=1":
            ratios[w] = ratio
        if mode == "async eta=1 +reward worker":
            ratios[f"{w} (+reward worker)"] = ratio
        rows.append([w, mode, merged["s/step"], ratio, merged["eval start"], merged["eval end"],
                     *("" if merged[k] is None else merged[k] for k in
                       ("rollout s", "update s", "learner idle", "generators idle", "sync s", "staleness"))])
    header = ["workload", "mode", "s/step", "/ sync", "eval start", "eval end", "rollout s", "update s",
              "learner idle", "generators idle", "weight sync s", "staleness"]
    title = (f"async_vs_sync: {args.steps} steps, {args.workers} rollout workers, {args.repeats} repeat(s); "
             f"{machine()}")
    latency = {w: r for w, r in ratios.items() if "latency" in w}
    headline = ("async (eta=1) / sync s/step = " + ", ".join(f"{w} {r:.3f}" for w, r in (latency or ratios).items())
                + " (goal <= 0.6 on the latency-bound workloads at a held-out reward within noise of sync)")
    return Report([table(title, header, rows)], headline)


if __name__ == "__main__":
    run(__doc__, options, measure, quiet=True)
