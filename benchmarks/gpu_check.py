"""A one-GPU check of the CPU defaults: the tiny smoke configs on CUDA in bf16, under the default
strategy and under FSDP2, plus the vLLM backend when vLLM is installed and asynchronous training on Ray
when Ray is.

Each run is `mmrl train` in a subprocess with a timeout, writing into `--out` (default: a new temp
folder), one run directory per run:

    <config> default   python -m mmrl train CONFIG precision=bf16 cpu=false max_steps=N eval.every=0
    <config> fsdp_x1   torchrun --standalone --nproc_per_node 1 -m mmrl train CONFIG ... distributed.strategy=fsdp
    <config> fsdp_xG   the same on G GPUs (only with --gpus G > 1; train.prompts_per_step = 2 G, so each
                       GPU gets the 2 prompts of the one-GPU run)
    vlm_tiny vllm      the default run with policy.backend=vllm (skipped unless `import vllm` works here)
    vlm_tiny async_colocated  asynchronous training on Ray, one GPU shared: the learner as one Ray actor and one
                       rollout worker, half the GPU each (gpus_per_learner = gpus_per_worker = 0.5), eta 1, the
                       decoupled objective, weights over gloo (skipped unless `import ray` works here)

for CONFIG in configs/tiny/vlm_tiny.yaml and configs/tiny/sd3_tiny.yaml. "default" is one plain
process (distributed.strategy keeps its default, ddp, which has nothing to wrap on one process).
torchrun is started as `python -m torch.distributed.run` with this interpreter, so it is the same
environment. Each run's stdout and stderr are kept next to its run directory (<dir>.stdout.log,
<dir>.stderr.log). From each run's metrics.jsonl it reads the median `time/step_s` of the steps
after the first (the first holds compilation and allocator warm-up), the peak of
`mem/peak_cuda_bytes`, and the peak of `mem/params_bytes + mem/grads_bytes + mem/optim_bytes`
(this rank's model states); a key a run did not log reads "n/a". It prints a markdown table for
BENCHMARKS.md (date, GPU, torch version) and a `headline:` line, and writes the table and the raw
numbers to `<out>/gpu_check.json`. Exit code 0 when every run that was not skipped exited 0, 1
otherwise, 2 without a CUDA device.

    python benchmarks/gpu_check.py [--steps 4] [--gpus 1] [--timeout 900] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"vlm_tiny": "configs/tiny/vlm_tiny.yaml", "sd3_tiny": "configs/tiny/sd3_tiny.yaml"}
STATE_KEYS = ("mem/params_bytes", "mem/grads_bytes", "mem/optim_bytes")
TIMEOUT_RC = 124                     # the exit code recorded for a run killed at its timeout
NA = "n/a"


@dataclass(frozen=True)
class RunSpec:
    """One run: `argv` is run at the repo root and writes `out_dir`; `skip` says why it is not run."""

    name: str
    argv: list[str]
    out_dir: str
    skip: Optional[str] = None


@dataclass(frozen=True)
class RunMetrics:
    """What one run's metrics.jsonl says; None where the run did not log the key(s)."""

    steps: int                                   # training rows (rows with time/step_s)
    step_s: Optional[float]                      # median time/step_s over the steps after the first
    peak_cuda_bytes: Optional[int]               # max mem/peak_cuda_bytes
    state_bytes: Optional[int]                   # max of params + grads + optim bytes (rows holding all three)


@dataclass(frozen=True)
class RunResult:
    spec: RunSpec
    returncode: Optional[int]                    # None when skipped; TIMEOUT_RC when killed at the timeout
    wall_s: Optional[float]
    metrics: Optional[RunMetrics]
    stderr_tail: str = ""                        # only for a run that failed


# ---------------------------------------------------------------- metrics.jsonl

def _number(row: dict, key: str) -> Optional[float]:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def read_metrics(path: str) -> RunMetrics:
    """Summarize a metrics.jsonl (a missing file, blank or cut-off lines are tolerated)."""
    rows = []
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue                     # blank, or cut short by a kill
                if isinstance(row, dict):
                    rows.append(row)
    return summarize_rows(rows)


def summarize_rows(rows: list[dict]) -> RunMetrics:
    """The median step time after the first step, the peak CUDA bytes and the peak model-state bytes."""
    train = sorted((r for r in rows if _number(r, "time/step_s") is not None), key=lambda r: r.get("step", 0))
    later = [_number(r, "time/step_s") for r in train[1:]]
    peaks = [p for p in (_number(r, "mem/peak_cuda_bytes") for r in rows) if p is not None]
    states = [sum(parts) for parts in ([_number(r, k) for k in STATE_KEYS] for r in rows) if None not in parts]
    return RunMetrics(steps=len(train), step_s=statistics.median(later) if later else None,
                      peak_cuda_bytes=int(max(peaks)) if peaks else None,
                      state_bytes=int(max(states)) if states else None)


def human_bytes(n: Optional[float]) -> str:
    """'12.3 MiB' / '1.20 GiB'; "n/a" for None."""
    if n is None:
        return NA
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def seconds(s: Optional[float]) -> str:
    return NA if s is None else f"{s:.3f}"


# ---------------------------------------------------------------- the runs

def train_argv(python: str, config: str, out_dir: str, steps: int, extra: list[str], nproc: int = 0) -> list[str]:
    """`mmrl train` of `config` on CUDA in bf16; under torchrun with `nproc` processes when nproc > 0."""
    launcher = [python, "-m", "mmrl"] if nproc == 0 else [
        python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "-m", "mmrl"]
    return [*launcher, "train", config, f"output_dir={out_dir}", f"max_steps={steps}", "precision=bf16",
            "cpu=false", "eval.every=0", "logging.progress=false", *extra]


def _spec(out: str, name: str, label: str, steps: int, extra: list[str], python: str, nproc: int = 0) -> RunSpec:
    d = os.path.join(out, f"{name}_{label}")
    return RunSpec(f"{name} {label}", train_argv(python, CONFIGS[name], d, steps, extra, nproc), d)


ASYNC_COLOCATED = ["asynchronous.enabled=true", "asynchronous.learner_processes=1", "asynchronous.gpus_per_learner=0.5",
                   "asynchronous.gpus_per_worker=0.5", "asynchronous.max_staleness=1", "algo.objective=decoupled",
                   "asynchronous.weight_sync=gloo"]


def run_specs(out: str, steps: int = 4, gpus: int = 1, has_vllm: bool = False,
              python: str = sys.executable, has_ray: bool = False) -> list[RunSpec]:
    """Every run of the check, in order (pure: nothing is run or created)."""
    fsdp = ["distributed.strategy=fsdp"]
    specs = []
    for name in CONFIGS:
        specs.append(_spec(out, name, "default", steps, [], python))
        specs.append(_spec(out, name, "fsdp_x1", steps, fsdp, python, nproc=1))
        if gpus > 1:   # each GPU gets the 2 prompts of the one-GPU run
            specs.append(_spec(out, name, f"fsdp_x{gpus}", steps, [*fsdp, f"train.prompts_per_step={2 * gpus}"],
                               python, nproc=gpus))
    vllm = _spec(out, "vlm_tiny", "vllm", steps, ["policy.backend=vllm"], python)
    specs.append(vllm if has_vllm else RunSpec(vllm.name, vllm.argv, vllm.out_dir, skip="skipped: vllm not installed"))
    colocated = _spec(out, "vlm_tiny", "async_colocated", steps, ASYNC_COLOCATED, python)
    specs.append(colocated if has_ray else RunSpec(colocated.name, colocated.argv, colocated.out_dir,
                                                   skip="skipped: ray not installed"))
    return specs


def vllm_importable(python: str = sys.executable) -> bool:
    """Whether `import vllm` works in this interpreter (tried in a child, so this process stays clean)."""
    try:
        done = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def execute(argv: list[str], timeout: float, log_prefix: str) -> tuple[int, float, str]:
    """Run `argv` at the repo root in its own process group (a timeout kills torchrun's workers too);
    stdout and stderr go to `<log_prefix>.stdout.log` / `.stderr.log`. Returns (exit code, wall s, stderr)."""
    t0 = time.perf_counter()
    with subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            code = TIMEOUT_RC
            err += f"\ngpu_check: killed after the {timeout:.0f} s timeout"
    wall = time.perf_counter() - t0
    for suffix, text in (("stdout", out), ("stderr", err)):
        with open(f"{log_prefix}.{suffix}.log", "w", encoding="utf-8") as f:
            f.write(text)
    return code, wall, err


def run_one(spec: RunSpec, timeout: float, tail_lines: int = 20) -> RunResult:
    if spec.skip:
        return RunResult(spec, None, None, None)
    print(f"gpu_check: {spec.name}: {' '.join(spec.argv)}", file=sys.stderr, flush=True)
    code, wall, err = execute(spec.argv, timeout, spec.out_dir)
    tail = "" if code == 0 else "\n".join(err.rstrip().splitlines()[-tail_lines:])
    return RunResult(spec, code, wall, read_metrics(os.path.join(spec.out_dir, "metrics.jsonl")), tail)


# ---------------------------------------------------------------- report

def status(r: RunResult) -> str:
    if r.spec.skip:
        return r.spec.skip
    return "ok" if r.returncode == 0 else ("timeout" if r.returncode == TIMEOUT_RC else f"exit {r.returncode}")


def result_row(r: RunResult) -> list[str]:
    m = r.metrics
    wall = NA if r.wall_s is None else f"{r.wall_s:.1f}"
    return [r.spec.name, status(r), wall, seconds(m.step_s if m else None),
            human_bytes(m.peak_cuda_bytes if m else None), human_bytes(m.state_bytes if m else None)]


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def headline(results: list[RunResult]) -> str:
    """fsdp x1 / default step time for each config (vlm_tiny first)."""
    by_name = {r.spec.name: r for r in results}
    parts = []
    for name in CONFIGS:
        a, b = by_name.get(f"{name} fsdp_x1"), by_name.get(f"{name} default")
        ok = a and b and a.metrics and b.metrics and a.metrics.step_s and b.metrics.step_s
        parts.append(f"{name} {a.metrics.step_s / b.metrics.step_s:.3f}" if ok else f"{name} {NA}")
    failed = [r.spec.name for r in results if not r.spec.skip and r.returncode != 0]
    return ("fsdp / default step time on 1 GPU, bf16: " + ", ".join(parts)
            + (f"; FAILED: {', '.join(failed)}" if failed else "; all runs exited 0"))


def report(results: list[RunResult], device: str, torch_version: str, steps: int) -> str:
    """The markdown block for BENCHMARKS.md: a one-line context, the table, and failure tails."""
    header = ["run", "status", "wall s", "median step s", "peak CUDA", "model states / rank"]
    text = [f"{datetime.date.today().isoformat()}, {device}, torch {torch_version}, bf16, "
            f"{steps} steps per run (median step time over steps 2..{steps})", "",
            markdown_table(header, [result_row(r) for r in results])]
    for r in results:
        if r.stderr_tail:
            text += ["", f"{r.spec.name} ({status(r)}), stderr tail:", "```", r.stderr_tail, "```"]
    return "\n".join(text)


def write_json(path: str, results: list[RunResult], table_text: str, line: str, context: dict) -> None:
    raw = [{**asdict(r), "status": status(r)} for r in results]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**context, "table": table_text, "headline": line, "runs": raw}, f, indent=2)


# ---------------------------------------------------------------- main

def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="training steps per run (the first is not timed)")
    ap.add_argument("--gpus", type=int, default=1, help="G > 1 adds an FSDP run of each config on G GPUs")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds before a run is killed")
    ap.add_argument("--out", default=None, help="folder for the run directories and gpu_check.json "
                                                "(default: a new temp folder)")
    return ap.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: needs a CUDA device (torch.cuda.is_available() is False); run it on a GPU machine",
              file=sys.stderr)
        return 2
    if args.gpus > torch.cuda.device_count():
        print(f"gpu_check: --gpus {args.gpus} but only {torch.cuda.device_count()} CUDA devices", file=sys.stderr)
        return 2
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="mmrl_gpu_check_"))
    os.makedirs(out, exist_ok=True)
    import importlib.util

    has_ray = importlib.util.find_spec("ray") is not None
    results = [run_one(s, args.timeout)
               for s in run_specs(out, args.steps, args.gpus, vllm_importable(), has_ray=has_ray)]
    device = torch.cuda.get_device_name()          # after the runs: this process holds no CUDA context during them
    table_text, line = report(results, device, torch.__version__, args.steps), headline(results)
    context = {"date": datetime.date.today().isoformat(), "device": device, "torch": torch.__version__,
               "steps": args.steps, "gpus": args.gpus, "out": out}
    write_json(os.path.join(out, "gpu_check.json"), results, table_text, line, context)
    print(table_text)
    print(f"headline: {line}")
    print(f"gpu_check: run directories and gpu_check.json in {out}", file=sys.stderr)
    return 0 if all(r.spec.skip or r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
