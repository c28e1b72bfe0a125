"""Video rewards: an image reward lifted to a video, frame by frame.

`per_frame` scores each frame of a `rewards.sample.Video` (all of them, or `frames` evenly spaced ones, the
first and the last included) with any image reward, each frame as a `Sample` of its own (the video's prompt,
answer and meta; id "<video id> frame k"), and reduces a video's frame scores to one:

    mean   the average frame: rewards a video whose frames are good on the whole. It can be gamed by a clip
           that is good on most frames and broken on a few (a flicker, a frame of noise), and it is blind to
           motion: a still image repeated F times scores as that image does.
    min    the worst frame: every frame must be good, so one broken frame costs the whole video; still blind
           to motion, and noisier to learn from (one frame decides).

A frame the image reward cannot score (None) leaves the video unscored (None); outputs that are not videos
score None. What moves, and whether consecutive frames belong to one scene, needs a reward of its own.

Temporal consistency: whether consecutive frames belong to one scene. Both rewards below score the
consecutive pairs of a video's picked frames (all, or `frames` >= 2 evenly spaced ones, first and last
included) and reduce the pairs to one score; a video with fewer than 2 picked frames, and an output that is
not a video, score None.

`temporal_clip` rewards frame-to-frame consistency as the cosine similarity of consecutive frames' CLIP
image embeddings (open_clip, built as `clip_score` builds it), in [-1, 1], 1 when the two frames embed
alike; `reduce: mean` averages the pairs, `reduce: min` keeps the least similar pair (a cut or a flicker
anywhere costs the video). Frame consistency in a feature space is how video benchmarks score it; VBench's
"subject consistency" (Huang et al. 2024, "VBench: Comprehensive Benchmark Suite for Video Generative
Models") uses DINO features and its "background consistency" CLIP features; here it is CLIP, for both.
How it is gamed:
    - a still clip (one image repeated) scores 1 (up to float rounding), and so does a blank clip: it
      rewards the absence of change, not good motion;
    - CLIP embeddings are coarse: small motion, a wrong direction, a flicker of texture or an object that
      swaps for another of its class (one cat for another, a face for another face) barely move the
      cosine; only changes of content or layout at the level CLIP sees are punished.

`temporal_warp` is an optical-flow warp error, as in Lai et al. 2018 ("Learning Blind Video Temporal
Consistency", ECCV): for each consecutive pair (a, b), OpenCV's Farneback dense flow (Farneback 2003,
"Two-frame motion estimation based on polynomial expansion", SCIA) from a to b on grayscale, b warped back
onto a along that flow (cv2.remap, bilinear, borders replicated), and the error the mean absolute RGB
difference of the warped b and a, in [0, 1] over pixels and channels. Lai et al. mask the pixels that
the flow marks as occluded; here no pixel is masked, so disocclusions count as error. The reward is the
NEGATIVE error, so higher is better and 0 is perfect: `reduce: mean` (the mean pair error) or `max` (the
worst pair). No weights, CPU only, deterministic; needs OpenCV (the `video` extra).
How it is gamed:
    - a still clip or a blank clip scores 0 (perfect; exactly 0 on smooth content, Farneback's estimate
      on identical frames of pure noise leaves about 1e-3): nothing moves, so nothing is warped wrong;
    - it is cheap on uniform regions (a flat background warps perfectly whatever the flow), so clips
      that are mostly empty, or blurred, score well;
    - it is blind to slow changes the flow cannot explain but that are small per pair: a slow fade, a
      drift of colour, a gradual morph all cost little per pair.

Neither says anything about what the video shows or whether it moves as asked: pair them with a reward for
content and motion (`per_frame` over an image reward, `shapes_motion` for the shapes world), or the policy
learns to stop moving.
"""

from __future__ import annotations

from rewards.builtin.clip import _clip_embeds, _open_clip, check_open_clip_args
from rewards.models import fixed_rows
from rewards.registry import check, register, resolve
from rewards.sample import Sample, Video, frame_indices

REDUCE = {"mean": lambda v: sum(v) / len(v), "min": min}


def _validate(reward: str, reduce: str = "mean", frames: int = 0, reward_kwargs: dict | None = None) -> None:
    if reduce not in REDUCE:
        raise ValueError(f"reward 'per_frame': reduce must be one of {', '.join(REDUCE)}; got {reduce!r}")
    if not isinstance(frames, int) or frames < 0:
        raise ValueError(f"reward 'per_frame': frames must be an integer >= 0 (0 = every frame); got {frames!r}")
    if reward_kwargs is not None and not isinstance(reward_kwargs, dict):
        raise ValueError(f"reward 'per_frame': reward_kwargs must be a mapping of the image reward's arguments; "
                         f"got {reward_kwargs!r}")
    try:
        check(reward, reward_kwargs)
    except ValueError as e:
        raise ValueError(f"reward 'per_frame': its image reward {reward!r}: {e}") from None


@register("per_frame", factory=True)
def per_frame(reward: str, reduce: str = "mean", frames: int = 0, reward_kwargs: dict | None = None):
    """An image reward applied to a video's frames and reduced by mean or min (module docstring)."""
    _validate(reward, reduce, frames, reward_kwargs)
    image_reward, reducer = resolve(reward, reward_kwargs), REDUCE[reduce]

    def score(samples: list) -> list[float | None]:
        spans, flat = [], []                          # spans[i]: sample i's slice of `flat`, or None (no video)
        for s in samples:
            if not isinstance(s.output, Video):
                spans.append(None)
                continue
            picks = frame_indices(len(s.output), frames)
            spans.append((len(flat), len(flat) + len(picks)))
            flat += [Sample(prompt=s.prompt, output=s.output.frames[k], images=s.images, answer=s.answer, meta=s.meta,
                            id=f"{s.id} frame {k}") for k in picks]
        values = list(image_reward(flat)) if flat else []
        if len(values) != len(flat):
            raise ValueError(f"reward 'per_frame': image reward {reward!r} returned {len(values)} scores for "
                             f"{len(flat)} frames")
        out = []
        for span in spans:
            part = None if span is None else values[span[0]:span[1]]
            out.append(None if part is None or any(v is None for v in part) else float(reducer(part)))
        return out

    return score


per_frame.mmrl_validate = _validate


# ------------------------------------------------------------------------------------------ temporal
PAIR_REDUCE = {"mean": lambda v: sum(v) / len(v), "min": min, "max": max}


def _positive_int(name: str, key: str, value, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"reward {name!r}: {key} must be an integer >= {least}; got {value!r}")


def _validate_pairs(name: str, frames, reduce, reduces: tuple[str, ...]) -> None:
    """The options every temporal reward takes: `frames` (0 or >= 2) and `reduce` over the pairs."""
    if reduce not in reduces:
        raise ValueError(f"reward {name!r}: reduce must be one of {', '.join(reduces)}; got {reduce!r}")
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 0 or frames == 1:
        raise ValueError(f"reward {name!r}: frames must be 0 (every frame) or an integer >= 2 (that many evenly "
                         f"spaced frames: a score needs a pair); got {frames!r}")


def _picked_frames(sample, frames: int) -> list | None:
    """The picked frames of a video sample (RGB), or None when it is no video or has fewer than 2 of them."""
    if not isinstance(sample.output, Video):
        return None
    picks = frame_indices(len(sample.output), frames)
    return [sample.output.frames[k].convert("RGB") for k in picks] if len(picks) >= 2 else None


def _validate_temporal_clip(model: str = "ViT-H-14", pretrained: str | None = "laion2b_s32b_b79k",
                            model_config: dict | None = None, device: str = "cpu", dtype: str = "float32",
                            batch_size: int = 32, frames: int = 0, reduce: str = "mean") -> None:
    name = "temporal_clip"
    _validate_pairs(name, frames, reduce, ("mean", "min"))
    _positive_int(name, "batch_size", batch_size)
    try:
        check_open_clip_args(dtype, model_config)
    except ValueError as e:
        raise ValueError(f"reward {name!r}: {e}") from None


@register("temporal_clip", factory=True)
def temporal_clip(model: str = "ViT-H-14", pretrained: str | None = "laion2b_s32b_b79k",
                  model_config: dict | None = None, device: str = "cpu", dtype: str = "float32", batch_size: int = 32,
                  frames: int = 0, reduce: str = "mean"):
    """Cosine of consecutive frames' CLIP image embeddings, reduced by mean or min (module docstring)."""
    import torch

    _validate_temporal_clip(model, pretrained, model_config, device, dtype, batch_size, frames, reduce)
    net, preprocess, _ = _open_clip(model, pretrained, model_config, device, dtype)
    reducer = PAIR_REDUCE[reduce]

    @torch.no_grad()
    def embed(batch: list) -> list:
        img, _ = _clip_embeds(net, preprocess, None, batch, device, with_text=False)  # [B, D], L2-normalised
        return list(img.cpu())

    def score(samples: list) -> list[float | None]:
        spans, flat = [], []                     # spans[i]: sample i's slice of `flat`, or None (unscored)
        for s in samples:
            picked = _picked_frames(s, frames)
            if picked is None:
                spans.append(None)
                continue
            spans.append((len(flat), len(flat) + len(picked)))
            flat += [Sample(prompt=s.prompt, output=f, id=f"{s.id} frame {k}") for k, f in enumerate(picked)]
        # calls of exactly batch_size frames: a video's score never depends on the other samples of the batch
        emb = fixed_rows(embed, flat, batch_size) if flat else []
        out: list[float | None] = []
        for span in spans:
            if span is None:
                out.append(None)
                continue
            e = torch.stack(emb[span[0]:span[1]])                                     # [F, D]
            out.append(float(reducer((e[:-1] * e[1:]).sum(-1).tolist())))            # F - 1 cosines
        return out

    return score


temporal_clip.mmrl_validate = _validate_temporal_clip


def _validate_temporal_warp(frames: int = 0, reduce: str = "mean", levels: int = 3, winsize: int = 15) -> None:
    name = "temporal_warp"
    _validate_pairs(name, frames, reduce, ("mean", "max"))
    _positive_int(name, "levels", levels)
    _positive_int(name, "winsize", winsize, least=3)


def warp_error(a, b, levels: int = 3, winsize: int = 15) -> float:
    """Mean absolute RGB difference in [0, 1] between frame `a` and frame `b` warped back onto `a` along the
    Farneback flow from a to b (PIL images of one size). Needs OpenCV."""
    import cv2
    import numpy as np

    a, b = np.asarray(a.convert("RGB"), dtype=np.uint8), np.asarray(b.convert("RGB"), dtype=np.uint8)  # [H, W, 3]
    if a.shape != b.shape:
        raise ValueError(f"frames of different sizes: {a.shape} and {b.shape}")
    ga, gb = cv2.cvtColor(a, cv2.COLOR_RGB2GRAY), cv2.cvtColor(b, cv2.COLOR_RGB2GRAY)
    # flow[y, x] = (dx, dy): the pixel (x, y) of a is found at (x + dx, y + dy) in b
    flow = cv2.calcOpticalFlowFarneback(ga, gb, None, pyr_scale=0.5, levels=levels, winsize=winsize,
                                        iterations=3, poly_n=5, poly_sigma=1.2, flags=0)   # [H, W, 2]
    h, w = ga.shape
    xs, ys = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))  # [H, W] each
    warped = cv2.remap(b, xs + flow[..., 0], ys + flow[..., 1], interpolation=cv2.INTER_LINEAR,
                       borderMode=cv2.BORDER_REPLICATE)                                    # [H, W, 3]
    return float(np.abs(warped.astype(np.float32) - a.astype(np.float32)).mean() / 255.0)


@register("temporal_warp", factory=True)
def temporal_warp(frames: int = 0, reduce: str = "mean", levels: int = 3, winsize: int = 15):
    """Minus the optical-flow warp error of consecutive frames, mean or max over pairs; 0 is perfect (module docstring).

    `levels` and `winsize` are Farneback's pyramid levels (1: the frame alone) and averaging window in pixels.
    """
    _validate_temporal_warp(frames, reduce, levels, winsize)
    try:
        import cv2  # noqa: F401
    except ImportError as e:
        raise ImportError("reward 'temporal_warp' needs OpenCV: pip install opencv-python-headless, or the "
                          'video extra: pip install -e ".[video]"') from e
    reducer = PAIR_REDUCE[reduce]

    def score(samples: list) -> list[float | None]:
        out: list[float | None] = []
        for s in samples:
            picked = _picked_frames(s, frames)
            if picked is None:
                out.append(None)
                continue
            errors = [warp_error(a, b, levels, winsize) for a, b in zip(picked, picked[1:])]  # F - 1 pairs
            out.append(0.0 - float(reducer(errors)))                                      # 0.0, never -0.0
        return out

    return score


temporal_warp.mmrl_validate = _validate_temporal_warp
