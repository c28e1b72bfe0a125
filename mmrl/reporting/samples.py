"""Write samples with their scores to JSONL (images saved beside it as PNG, videos as animated GIF and, where
imageio's ffmpeg is installed, MP4)."""

from __future__ import annotations

import json
import math
import os

import torch

from mmrl.episodes import EpisodeMeta
from rewards.sample import Video, frame_indices

STRIP_FRAMES = 8          # frames of each video shown in a samples grid (evenly spaced, first and last included)


def write_video(stem: str, video: Video) -> list[str]:
    """Save `video` as `stem`.gif (PIL, every frame, looping) and `stem`.mp4 when imageio can encode it
    (`pip install imageio imageio-ffmpeg`); returns the paths written."""
    frames = [f.convert("RGB") for f in video.frames]
    paths = [stem + ".gif"]
    frames[0].save(paths[0], save_all=True, append_images=frames[1:], duration=max(1, round(1000 / video.fps)),
                   loop=0)
    try:
        import imageio
        import imageio_ffmpeg  # noqa: F401  (imageio's ffmpeg plugin; what diffusers' export_to_video needs too)
    except ImportError:
        return paths
    import numpy as np

    w, h = frames[0].size
    if w % 2 == 0 and h % 2 == 0:  # H.264 in yuv420p needs even sides
        with imageio.get_writer(stem + ".mp4", fps=video.fps, codec="libx264", quality=8,
                                macro_block_size=1) as writer:
            for f in frames:
                writer.append_data(np.asarray(f))
        paths.append(stem + ".mp4")
    return paths


def frame_strip(video: Video, frames: int = STRIP_FRAMES) -> list:
    """Up to `frames` frames of `video`, evenly spaced, the first and the last included."""
    return [video.frames[k] for k in frame_indices(len(video), frames)]


def _output_field(output, image_dir: str, i: int):
    if isinstance(output, str) or output is None:
        return output
    if isinstance(output, Video):
        os.makedirs(image_dir, exist_ok=True)
        path = write_video(os.path.join(image_dir, f"{i:04d}"), output)[0]
        return os.path.relpath(path, os.path.dirname(image_dir))
    if hasattr(output, "save"):  # a PIL image
        os.makedirs(image_dir, exist_ok=True)
        path = os.path.join(image_dir, f"{i:04d}.png")
        output.save(path)
        return os.path.relpath(path, os.path.dirname(image_dir))
    return repr(output)


def write_grid(path: str, images: list, columns: int = 8) -> None:
    """Save PIL images (all the same size) as one PNG grid, row-major."""
    from PIL import Image

    w, h = images[0].size
    cols = min(columns, len(images))
    rows = (len(images) + cols - 1) // cols
    grid = Image.new("RGB", (cols * w, rows * h))
    for i, im in enumerate(images):
        grid.paste(im.convert("RGB").resize((w, h)), ((i % cols) * w, (i // cols) * h))
    grid.save(path)


def write_strip(path: str, images: list, captions: list[str], side: int = 112) -> None:
    """Save PIL images side by side (each resized to `side` pixels high, its aspect kept, nearest) with a caption
    under each: one episode's observations and the move made from each."""
    from PIL import Image, ImageDraw

    pad = 14
    sized = [im.convert("RGB").resize((max(1, round(side * im.width / im.height)), side), Image.NEAREST)
             for im, _ in zip(images, captions)]
    strip = Image.new("RGB", (sum(im.width + 4 for im in sized), side + pad), "white")
    draw = ImageDraw.Draw(strip)
    x = 0
    for im, caption in zip(sized, captions):
        strip.paste(im, (x, 0))
        draw.text((x + 2, side + 1), caption[:max(18, im.width // 6)], fill="black")
        x += im.width + 4
    strip.save(path)


def write_samples(path: str, samples: list, scores: torch.Tensor, labels: list[str],
                  advantages: torch.Tensor | None = None, totals: torch.Tensor | None = None,
                  versions: list[list[int]] | None = None) -> None:
    """One JSON line per sample: id, prompt, output (an image's PNG path, a video's GIF path), answer, each reward's score
    [M, K] by label, the record's `task` when it has one, and optionally the weighted total reward [M]
    (`reward`), the advantage [M] and the policy version that produced each of its actions (`versions`)."""
    image_dir = os.path.splitext(path)[0]
    with open(path, "w", encoding="utf-8") as f:
        for i, s in enumerate(samples):
            row = {"id": s.id, "prompt": s.prompt, "output": _output_field(s.output, image_dir, i),
                   "answer": s.answer if isinstance(s.answer, (str, int, float, list, type(None))) else repr(s.answer),
                   "scores": {k: (None if math.isnan(v) else v) for k, v in zip(labels, scores[i].tolist())}}
            task = (s.meta or {}).get("task")
            if isinstance(task, str):
                row["task"] = task
            calls = s.meta.get(EpisodeMeta.TOOL_CALLS) if isinstance(s.meta, dict) else None
            if calls and any(calls):
                row["tool_calls"] = calls          # per reply: {name, arguments, error, result, images}
            if totals is not None:
                row["reward"] = None if math.isnan(float(totals[i])) else float(totals[i])
            if advantages is not None:
                row["advantage"] = float(advantages[i])
            if versions is not None:
                row["versions"] = versions[i]
            f.write(json.dumps(row, default=repr) + "\n")
    images = [s.output for s in samples if hasattr(s.output, "save")]
    if images and len(images) == len(samples):
        write_grid(os.path.splitext(path)[0] + "_grid.png", images)
    videos = [s.output for s in samples if isinstance(s.output, Video)]
    if videos and len(videos) == len(samples):  # one row per video: its frame strip
        strips = [frame_strip(v) for v in videos]
        width = max(len(s) for s in strips)
        write_grid(os.path.splitext(path)[0] + "_grid.png",
                   [s[k] if k < len(s) else s[-1] for s in strips for k in range(width)], columns=width)
