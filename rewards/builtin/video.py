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
"""

from __future__ import annotations

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
