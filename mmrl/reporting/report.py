"""`mmrl report RUN_DIR`: one self-contained HTML page per run, `RUN_DIR/report.html`, read from what the
run directory holds (metrics.jsonl, config.yaml, samples/eval_step_*), so it also covers a resumed run and
can be written while a run is still going. No server and no network: every figure is a PNG (a video a GIF)
inside the page.

The page shows, when the run logged them: the train and held-out reward curves, each reward's own curve,
the held-out reward per task (`eval/task/...`), success and quality diagnostics; a table of every
evaluation; the held-out reward per task and per gold answer before and after (text outputs); the image
grid (videos: a frame strip per clip) or first episode strip of every evaluation; the first held-out videos of the
first and last evaluation (animated GIFs); before/after; step timings and memory.

A script in the page checks on load that every figure decoded (`<body data-figures>` = figures the page
holds, `data-rendered` = figures the browser drew) and shows a warning above the page when one did not.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import re
import time

from mmrl.reporting.summary import (TASK_HEADER, eval_files, read_jsonl, read_rows, reward_figure, series,
                                    summary_text, task_table)
from mmrl.state.checkpoint import write_text_atomic

MIB = 2 ** 20
MAX_ANSWER_ROWS = 24          # sample rows shown in the answers table (the full list is in before_after.md)


def _keys(rows: list[dict], pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return sorted({k for r in rows for k in r if rx.fullmatch(k)})


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _line_figure(rows: list[dict], lines: list[tuple[str, str, str]], ylabel: str, scale: float = 1.0) -> str | None:
    """A PNG (base64) of `lines` [(metric key, legend label, matplotlib style)] against step, or None when
    none of the keys has a value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [(k, label, style) for k, label, style in lines if series(rows, k)[0]]
    if not present:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for key, label, style in present:
        steps, values = series(rows, key)
        ax.plot(steps, [v / scale for v in values], style, label=label, alpha=0.85, markersize=4)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, framealpha=0.9)
    return _png(fig)


def _each_reward_lines(rows: list[dict]) -> list[tuple[str, str, str]]:
    """Each reward's train and held-out curve; none for a run of one reward (its curve is the total's)."""
    labels = sorted({m.group(1) for k in {k for r in rows for k in r}
                     for m in [re.fullmatch(r"(?:eval/)?reward/(.+)/mean", k)] if m})
    if len(labels) < 2:
        return []
    return [line for label in labels for line in ((f"reward/{label}/mean", f"train {label}", "-"),
                                                  (f"eval/reward/{label}/mean", f"eval {label}", "o--"))]


def _figure(title: str, b64: str | None, caption: str = "", width: int | None = None, kind: str = "png") -> str:
    """A <figure> of a base64 PNG (or GIF: `kind`; nothing for None), drawn `width` CSS pixels wide when given."""
    if b64 is None:
        return ""
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    size = f' style="width:{width}px"' if width else ""
    return f'<figure><img alt="{html.escape(title)}"{size} src="data:image/{kind};base64,{b64}">{cap}</figure>'


MIN_PICTURE_WIDTH = 480       # small image grids (32-pixel samples) are drawn enlarged, pixels kept sharp


def _picture(title: str, path: str, caption: str, min_width: int = MIN_PICTURE_WIDTH) -> str:
    """A saved PNG (a grid, a strip) or animated GIF (a video sample) as a figure, enlarged by a whole factor
    when it is narrower than `min_width`."""
    if not os.path.isfile(path):
        return ""
    from PIL import Image

    with open(path, "rb") as f:
        data = f.read()
    with Image.open(io.BytesIO(data)) as im:
        width = im.width
    scale = max(1, min_width // max(width, 1))
    return _figure(title, base64.b64encode(data).decode("ascii"), caption, width * scale if scale > 1 else None,
                   "gif" if path.endswith(".gif") else "png")


VIDEOS_SHOWN = 4              # held-out videos played in the report, from the first and the last evaluation


def _videos(evals: list) -> str:
    """The first held-out videos (animated GIFs) of the first and the last evaluation."""
    figures = []
    for step, path in (evals[0], evals[-1]) if len(evals) >= 2 else evals:
        rows = [r for r in read_jsonl(path) if isinstance(r.get("output"), str) and r["output"].endswith(".gif")]
        for r in rows[:VIDEOS_SHOWN]:
            caption = f"step {step}: {r.get('prompt', '')} (reward {_fmt(r.get('reward'))})"
            figures.append(_picture(f"step {step} video", os.path.join(os.path.dirname(path), r["output"]), caption,
                                    min_width=128))
    return "".join(figures)


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value) if isinstance(value, (str, int)) else json.dumps(value, default=repr)


def _status(rows: list[dict], config: dict) -> str:
    last = max((r.get("step", 0) for r in rows), default=0)
    total = config.get("max_steps")
    if isinstance(total, int) and last >= total:
        return f"finished: step {last} of {total}"
    return f"step {last} of {total if total is not None else '?'} (running, stopped or interrupted)"


def _section(title: str, body: str) -> str:
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>" if body else ""


def _sections(run_dir: str, rows: list[dict], config: dict) -> list[str]:
    out = []
    rewards = reward_figure(rows)                          # the figure of reward_curve.png
    curves = [_figure("rewards", None if rewards is None else _png(rewards),
                      "train reward/mean (every step) and the held-out evaluation (greedy / ODE outputs)"),
              _figure("each reward", _line_figure(rows, _each_reward_lines(rows), "reward"),
                      "each reward of the run on its own: train (solid) and held-out (dashed)"),
              _figure("held-out by task", _line_figure(rows, [(k, k[len("eval/task/"):-len("/reward/mean")], "o-")
                                                              for k in _keys(rows, r"eval/task/.+/reward/mean")],
                                                       "held-out reward"),
                      "held-out reward per task (the records' task field)")]
    out.append(_section("Curves", "".join(curves)))
    eval_rows = [r for r in rows if any(k.startswith("eval/") for k in r)]
    eval_keys = sorted({k for r in eval_rows for k in r if k.startswith("eval/") and not k.endswith("/std")})
    if eval_rows:
        out.append(_section("Evaluations", _table(["step"] + eval_keys, [[r["step"]] + [r.get(k) for k in eval_keys]
                                                                         for r in eval_rows])))
    evals = eval_files(run_dir)
    if len(evals) >= 2:
        first, last = read_jsonl(evals[0][1]), read_jsonl(evals[-1][1])
        if first and all(isinstance(r.get("output"), str) and not r["output"].endswith((".png", ".gif"))
                         for r in first):
            header = [h.replace("before", f"step {evals[0][0]}").replace("after", f"step {evals[-1][0]}")
                      for h in TASK_HEADER]
            answers = [[a.get("prompt"), a.get("answer"), a.get("output"), a.get("reward"), b.get("output"),
                        b.get("reward")] for a, b in list(zip(first, last))[:MAX_ANSWER_ROWS]]
            out.append(_section("Held-out reward by task and gold answer", _table(header, task_table(first, last))
                                + f"<h3>The first {len(answers)} held-out answers</h3>"
                                + _table(["prompt", "gold", f"step {evals[0][0]}", "reward",
                                          f"step {evals[-1][0]}", "reward"], answers)))
    pictures = []
    for step, path in evals:
        stem = os.path.splitext(path)[0]
        for suffix, what in (("_grid.png", "held-out images (videos: a frame strip per row)"),
                             ("_episode.png", "first held-out episode")):
            pictures.append(_picture(f"step {step} {what}", stem + suffix, f"step {step}: {what}"))
    out.append(_section("Held-out outputs at each evaluation", "".join(pictures)))
    out.append(_section("Held-out videos", _videos(evals)))
    out.append(_section("Before and after", _picture("before and after", os.path.join(run_dir, "before_after.png"),
                                                      "the first evaluation above the last (videos: each clip's frames "
                                                      "before on the left, after on the right)")))
    time_keys = _keys(rows, r"time/.+_s")
    timing = _figure("step time", _line_figure(rows, [(k, k, "-") for k in time_keys], "seconds"))
    if time_keys:
        means = [[k, sum(series(rows, k)[1]) / len(series(rows, k)[1]), sum(series(rows, k)[1])] for k in time_keys]
        timing += _table(["timer", "mean per step (s)", "total (s)"], means)
    out.append(_section("Timings", timing))
    mem_keys = _keys(rows, r"mem/.+_bytes")
    memory = _figure("memory", _line_figure(rows, [(k, k, "-") for k in mem_keys], "MiB", MIB))
    if mem_keys:
        memory += _table(["memory", "peak (MiB)"], [[k, max(series(rows, k)[1]) / MIB] for k in mem_keys])
    out.append(_section("Memory", memory))
    return out


STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;color:#222}
h1{font-size:1.4em}h2{font-size:1.15em;border-bottom:1px solid #ccc;margin-top:1.6em}
figure{display:inline-block;margin:.4em;vertical-align:top}figure img{max-width:100%;image-rendering:pixelated}
figcaption{font-size:.8em;color:#555}table{border-collapse:collapse;font-size:.8em;margin:.5em 0;display:block;
overflow-x:auto}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}th{background:#f4f4f4}
pre{background:#f7f7f7;padding:.6em;font-size:.8em;overflow-x:auto}#broken{display:none;background:#fdd;padding:.5em}"""

CHECK = """window.addEventListener('load', () => {
  const figs = [...document.querySelectorAll('figure img')];
  const ok = figs.filter(i => i.complete && i.naturalWidth > 0);
  document.body.dataset.rendered = ok.length;
  if (ok.length < figs.length) {
    const w = document.getElementById('broken');
    w.textContent = (figs.length - ok.length) + ' of ' + figs.length + ' figures did not render';
    w.style.display = 'block';
  }
});"""


def render_report(run_dir: str) -> str:
    """The report page of `run_dir` as HTML text."""
    import yaml

    rows = read_rows(run_dir)
    config_path = os.path.join(run_dir, "config.yaml")
    config_text = open(config_path, encoding="utf-8").read() if os.path.isfile(config_path) else ""
    config = yaml.safe_load(config_text) if config_text else {}
    config = config if isinstance(config, dict) else {}
    policy = config.get("policy") if isinstance(config.get("policy"), dict) else {}
    algo = config.get("algo") if isinstance(config.get("algo"), dict) else {}
    facts = [["run directory", os.path.abspath(run_dir)], ["status", _status(rows, config)],
             ["policy", f"{policy.get('name', '?')} {policy.get('model', '')}".strip()],
             ["algorithm", ", ".join(f"{k}={algo[k]}" for k in ("advantage", "loss", "kl_beta") if k in algo)],
             ["seed", config.get("seed")], ["summary", summary_text(rows)],
             ["written", time.strftime("%Y-%m-%d %H:%M:%S")]]
    body = "".join(_sections(run_dir, rows, config))
    figures = body.count("<figure>")
    details = (f"<details><summary>config.yaml</summary><pre>{html.escape(config_text)}</pre></details>"
               if config_text else "")
    title = f"mmrl report: {os.path.basename(os.path.abspath(run_dir))}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{STYLE}</style></head>\n"
            f'<body data-figures="{figures}" data-rendered="0"><div id="broken"></div><h1>{html.escape(title)}</h1>'
            f"{_table(['', ''], facts)}{details}\n{body}\n<script>{CHECK}</script></body></html>\n")


def write_report(run_dir: str, out: str | None = None) -> str:
    """Write the report of `run_dir` to `out` (default RUN_DIR/report.html) atomically; returns the path.
    Raises FileNotFoundError when `run_dir` has no metrics.jsonl."""
    if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
        raise FileNotFoundError(f"{run_dir!r} has no metrics.jsonl: not an mmrl run directory, or a run that "
                                "has not logged a step yet")
    path = out or os.path.join(run_dir, "report.html")
    write_text_atomic(path, render_report(run_dir))
    return path
