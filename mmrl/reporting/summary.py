"""End-of-run report: a reward-curve PNG (train and eval) and a printed summary, both read
from metrics.jsonl so they also cover resumed runs."""

from __future__ import annotations

import json
import os


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def read_rows(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


QUALITY = "eval/quality/"       # eval.diagnostics (mmrl/loop/evaluation.py)


def quality_keys(rows: list[dict]) -> list[str]:
    return sorted({k for r in rows for k in r if k.startswith(QUALITY)})


def plot_rewards(run_dir: str, rows: list[dict]) -> str | None:
    """Write `reward_curve.png`: train reward/mean and eval/reward/mean against step, and the eval
    diagnostics (eval/quality/...) on a second axis next to them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals = _series(rows, "reward/mean"), _series(rows, "eval/reward/mean")
    if not train[0] and not evals[0]:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if train[0]:
        ax.plot(*train, label="train reward/mean", alpha=0.7)
    if evals[0]:
        ax.plot(*evals, "o-", label="eval/reward/mean")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    top = ax                                   # the legend goes on the upper axes, above every line
    if quality_keys(rows):
        qx = ax.twinx()
        for i, key in enumerate(quality_keys(rows)):
            qx.plot(*_series(rows, key), "s--", color=("tab:red", "tab:purple", "tab:brown", "tab:pink")[i % 4],
                    label=key, alpha=0.8)
        qx.set_ylabel("eval quality (diagnostic)")
        more = qx.get_legend_handles_labels()
        handles, labels, top = handles + more[0], labels + more[1], qx
    top.legend(handles, labels, fontsize=8, framealpha=0.9)
    fig.tight_layout()
    path = os.path.join(run_dir, "reward_curve.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def summary_text(rows: list[dict]) -> str:
    """`train reward 0.12 -> 0.97 over 40 steps; eval reward 0.12 (step 0) -> 1.00 (step 40)`."""
    parts = []
    steps, train = _series(rows, "reward/mean")
    if train:
        k = max(1, min(5, len(train) // 4))
        first, last = sum(train[:k]) / k, sum(train[-k:]) / k
        parts.append(f"train reward {first:.3f} -> {last:.3f} (mean of first/last {k} steps, {len(train)} steps)")
    esteps, evals = _series(rows, "eval/reward/mean")
    if evals:
        parts.append(f"eval reward {evals[0]:.3f} (step {esteps[0]}) -> {evals[-1]:.3f} (step {esteps[-1]})")
    for key in quality_keys(rows):
        qsteps, values = _series(rows, key)
        parts.append(f"{key[len('eval/'):]} {values[0]:.3f} (step {qsteps[0]}) -> {values[-1]:.3f} (step {qsteps[-1]})")
    return "; ".join(parts) or "no rewards logged"


def _eval_files(run_dir: str) -> list[str]:
    folder = os.path.join(run_dir, "samples")
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, n) for n in os.listdir(folder)
                  if n.startswith("eval_step_") and n.endswith(".jsonl"))


def _read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _cell(value) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")[:120]


def before_after(run_dir: str) -> str | None:
    """Compare the first and last evaluations: `before_after.png` (both image grids, one
    above the other) when outputs are images or episodes (the first held-out episode's strip),
    else `before_after.md` (a table of answers)."""
    files = _eval_files(run_dir)
    if len(files) < 2:
        return None
    first, last = files[0], files[-1]
    for suffix in ("_grid.png", "_episode.png"):                  # generated images, or an agent's episode strips
        grids = [os.path.splitext(p)[0] + suffix for p in (first, last)]
        if all(os.path.isfile(g) for g in grids):
            break
    if all(os.path.isfile(g) for g in grids):
        from PIL import Image, ImageDraw

        a, b = (Image.open(g).convert("RGB") for g in grids)
        scale = max(1, -(-256 // max(a.width, b.width)))          # small grids are enlarged (nearest)
        a, b = (im.resize((im.width * scale, im.height * scale), Image.NEAREST) for im in (a, b))
        pad = 12
        out = Image.new("RGB", (max(a.width, b.width, 160), a.height + b.height + 2 * pad), "white")
        draw = ImageDraw.Draw(out)
        draw.text((2, 0), f"before ({os.path.basename(first)[5:-6]})", fill="black")
        out.paste(a, (0, pad))
        draw.text((2, a.height + pad), f"after ({os.path.basename(last)[5:-6]})", fill="black")
        out.paste(b, (0, a.height + 2 * pad))
        path = os.path.join(run_dir, "before_after.png")
        out.save(path)
        return path
    rows_a, rows_b = _read_jsonl(first), _read_jsonl(last)
    lines = [f"# Held-out answers: {os.path.basename(first)} vs {os.path.basename(last)}", "",
             "| prompt | answer | before | before score | after | after score |", "|---|---|---|---|---|---|"]
    for ra, rb in zip(rows_a, rows_b):
        lines.append("| " + " | ".join(_cell(v) for v in (ra["prompt"], ra.get("answer"), ra["output"], ra["scores"],
                                                          rb["output"], rb["scores"])) + " |")
    path = os.path.join(run_dir, "before_after.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path
