"""End-of-run report: a reward-curve PNG (train and eval) and a printed summary, both read
from metrics.jsonl so they also cover resumed runs."""

from __future__ import annotations

import json
import os
import re
from collections import Counter


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of metric `key` over the rows that logged a number for it."""
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and "step" in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def read_jsonl(path: str) -> list[dict]:
    """The file's JSON objects, one per line ([] without the file); a line that does not parse (one a
    running or killed run is writing) is skipped."""
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return [r for r in rows if isinstance(r, dict)]


def read_rows(run_dir: str) -> list[dict]:
    return read_jsonl(os.path.join(run_dir, "metrics.jsonl"))


QUALITY = "eval/quality/"       # eval.diagnostics (mmrl/loop/evaluation.py)


def quality_keys(rows: list[dict]) -> list[str]:
    return sorted({k for r in rows for k in r if k.startswith(QUALITY)})


def reward_figure(rows: list[dict]):
    """A matplotlib figure of train reward/mean and eval/reward/mean against step, and the eval
    diagnostics (eval/quality/...) on a second axis next to them; None when neither reward was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals = series(rows, "reward/mean"), series(rows, "eval/reward/mean")
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
            qx.plot(*series(rows, key), "s--", color=("tab:red", "tab:purple", "tab:brown", "tab:pink")[i % 4],
                    label=key, alpha=0.8)
        qx.set_ylabel("eval quality (diagnostic)")
        more = qx.get_legend_handles_labels()
        handles, labels, top = handles + more[0], labels + more[1], qx
    top.legend(handles, labels, fontsize=8, framealpha=0.9)
    fig.tight_layout()
    return fig


def plot_rewards(run_dir: str, rows: list[dict]) -> str | None:
    """Write `reward_curve.png` (`reward_figure`); None when there is nothing to plot."""
    import matplotlib.pyplot as plt

    fig = reward_figure(rows)
    if fig is None:
        return None
    path = os.path.join(run_dir, "reward_curve.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def summary_text(rows: list[dict]) -> str:
    """`train reward 0.12 -> 0.97 over 40 steps; eval reward 0.12 (step 0) -> 1.00 (step 40)`."""
    parts = []
    steps, train = series(rows, "reward/mean")
    if train:
        k = max(1, min(5, len(train) // 4))
        first, last = sum(train[:k]) / k, sum(train[-k:]) / k
        parts.append(f"train reward {first:.3f} -> {last:.3f} (mean of first/last {k} steps, {len(train)} steps)")
    esteps, evals = series(rows, "eval/reward/mean")
    if evals:
        parts.append(f"eval reward {evals[0]:.3f} (step {esteps[0]}) -> {evals[-1]:.3f} (step {esteps[-1]})")
    for key in quality_keys(rows):
        qsteps, values = series(rows, key)
        parts.append(f"{key[len('eval/'):]} {values[0]:.3f} (step {qsteps[0]}) -> {values[-1]:.3f} (step {qsteps[-1]})")
    return "; ".join(parts) or "no rewards logged"


def eval_files(run_dir: str) -> list[tuple[int, str]]:
    """[(step, path)] of the held-out evaluations' sample files `samples/eval_step_<step, 6 digits>.jsonl`, by step."""
    folder = os.path.join(run_dir, "samples")
    if not os.path.isdir(folder):
        return []
    names = sorted(n for n in os.listdir(folder) if re.fullmatch(r"eval_step_\d+\.jsonl", n))
    return [(int(n[len("eval_step_"):-len(".jsonl")]), os.path.join(folder, n)) for n in names]


def _cell(value) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")[:120]


def _reward(row: dict) -> float | None:
    """A saved sample's total reward (`reward`), else the mean of its scores (files written before totals were)."""
    if "reward" in row:
        return row["reward"]
    values = [v for v in row.get("scores", {}).values() if v is not None]
    return sum(values) / len(values) if values else None


MAX_GOLDS = 12       # per-gold rows only for tasks with at most this many distinct gold answers


def _groups(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """{(task, gold): rows}: every task ("all" without task fields) as (task, "(all)"), and by gold answer
    where the gold is a short text and the task has at most MAX_GOLDS of them."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r.get("task", "all"), "(all)"), []).append(r)
    for task in sorted({t for t, _ in out}):
        mine = [r for r in rows if r.get("task", "all") == task]
        golds = {r.get("answer") for r in mine}
        if all(isinstance(g, (str, int)) for g in golds) and 1 < len(golds) <= MAX_GOLDS:
            for g in sorted(golds, key=str):
                out[(task, str(g))] = [r for r in mine if r.get("answer") == g]
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], kv[0][1] != "(all)", kv[0][1])))


def _mean_reward(rows: list[dict]) -> float | None:
    values = [v for v in map(_reward, rows) if v is not None]
    return sum(values) / len(values) if values else None


def _top_output(rows: list[dict]) -> str:
    """The most frequent output and its share: a policy that answers one thing to everything shows here."""
    outputs = [r["output"] for r in rows if isinstance(r.get("output"), str)]
    if not outputs:
        return ""
    top, n = Counter(outputs).most_common(1)[0]                  # ties: the first seen
    return f"{top.strip()[:40]} ({n / len(outputs):.0%})"


def task_table(before: list[dict], after: list[dict]) -> list[list[str]]:
    """Rows [task, gold, n, reward before, reward after, top output before, top output after] of two
    evaluations of the same held-out records: per task and per gold answer, so a rise that is a
    constant answer (right only on one gold) shows as one gold's column rising while the others fall."""
    a, b = _groups(before), _groups(after)
    fmt = lambda v: "" if v is None else f"{v:.3f}"  # noqa: E731
    return [[task, gold, str(len(rows)), fmt(_mean_reward(rows)), fmt(_mean_reward(b.get((task, gold), []))),
             _top_output(rows), _top_output(b.get((task, gold), []))] for (task, gold), rows in a.items()]


TASK_HEADER = ["task", "gold answer", "n", "reward before", "reward after", "top output before", "top output after"]


VIDEO_PAIRS_SHOWN = 16        # held-out clips in a video run's before_after.png (the first of the evaluation set)
MIN_FRAME_SIDE = 48           # ... with each frame enlarged (nearest) to at least this many pixels


def _video_strips(jsonl: str) -> list[tuple[dict, list]] | None:
    """Each row of an evaluation whose outputs are all videos (GIFs) with its frame strip [frames], cut from the
    evaluation's `_grid.png` (lossless; one row per clip, the frames `write_samples` chose); None otherwise."""
    rows, stem = read_jsonl(jsonl), os.path.splitext(jsonl)[0]
    if not rows or not all(str(r.get("output", "")).endswith(".gif") for r in rows) \
            or not os.path.isfile(stem + "_grid.png"):
        return None
    from PIL import Image

    with Image.open(os.path.join(os.path.dirname(jsonl), rows[0]["output"])) as gif:
        w, h = gif.size                                           # the grid's cell: the first clip's frame size
    grid = Image.open(stem + "_grid.png").convert("RGB")
    if grid.height != h * len(rows):
        return None
    return [(r, [grid.crop((k * w, i * h, (k + 1) * w, (i + 1) * h)) for k in range(grid.width // w)])
            for i, r in enumerate(rows)]


def _video_before_after(first: tuple[int, str], last: tuple[int, str], path: str) -> bool:
    """Write `path`: the first VIDEO_PAIRS_SHOWN held-out clips, one row each: the prompt with the reward before
    and after, then the clip's frame strip at the first evaluation beside the one at the last, frames enlarged
    and apart. False (nothing written) unless both evaluations' outputs are videos."""
    a, b = _video_strips(first[1]), _video_strips(last[1])
    if a is None or b is None:
        return False
    from PIL import Image, ImageDraw

    pairs = list(zip(a, b))[:VIDEO_PAIRS_SHOWN]
    w, h = pairs[0][0][1][0].size
    scale = max(1, -(-MIN_FRAME_SIDE // min(w, h)))
    fw, fh, gap, pad, text_h, head_h = w * scale, h * scale, 3, 8, 14, 22
    n = max(len(strip) for pair in pairs for _, strip in pair)
    strip_w = n * fw + (n + 1) * gap
    width, row_h = 2 * strip_w + 3 * pad, text_h + fh + 2 * gap + pad
    out = Image.new("RGB", (width, head_h + len(pairs) * row_h), "white")
    draw = ImageDraw.Draw(out)
    for col, (step, _) in enumerate((first, last)):
        draw.text((pad + col * (strip_w + pad), 2), f"{'before' if col == 0 else 'after'} (step {step})", fill="black")
    chars = max(8, (width - 2 * pad) // 6)                        # the default font is about 6 pixels a character
    for i, ((ra, sa), (rb, sb)) in enumerate(pairs):
        y = head_h + i * row_h
        caption = f"{ra.get('prompt', '')} (reward {_reward_text(ra)} -> {_reward_text(rb)})"
        draw.text((pad, y), caption[:chars], fill="black")
        for col, strip in enumerate((sa, sb)):
            x0 = pad + col * (strip_w + pad)
            draw.rectangle([x0, y + text_h, x0 + strip_w - 1, y + text_h + fh + 2 * gap - 1], fill=(150, 150, 150))
            for k, frame in enumerate(strip):
                out.paste(frame.resize((fw, fh), Image.NEAREST), (x0 + gap + k * (fw + gap), y + text_h + gap))
    out.save(path)
    return True


def _reward_text(row: dict) -> str:
    value = _reward(row)
    return "n/a" if value is None else f"{value:.2f}"


def before_after(run_dir: str) -> str | None:
    """Compare the first and last evaluations: `before_after.png` when outputs are videos (each of the first
    VIDEO_PAIRS_SHOWN clips' frame strips side by side, with its prompt), images (both image grids, one above the
    other) or episodes (the first held-out episode's strip), else `before_after.md` (the reward per task and per
    gold answer, then every answer)."""
    evals = eval_files(run_dir)
    if len(evals) < 2:
        return None
    (first, last), path = (evals[0][1], evals[-1][1]), os.path.join(run_dir, "before_after.png")
    if _video_before_after(evals[0], evals[-1], path):
        return path
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
        out.save(path)
        return path
    rows_a, rows_b = read_jsonl(first), read_jsonl(last)
    lines = [f"# Held-out answers: {os.path.basename(first)} vs {os.path.basename(last)}", "",
             "## Reward by task and gold answer", "",
             "| " + " | ".join(TASK_HEADER) + " |", "|---" * len(TASK_HEADER) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in task_table(rows_a, rows_b)]
    lines += ["", "## Every answer", "",
              "| prompt | answer | before | before score | after | after score |", "|---|---|---|---|---|---|"]
    for ra, rb in zip(rows_a, rows_b):
        lines.append("| " + " | ".join(_cell(v) for v in (ra["prompt"], ra.get("answer"), ra["output"], ra["scores"],
                                                          rb["output"], rb["scores"])) + " |")
    path = os.path.join(run_dir, "before_after.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path
