"""`judge`: a vision-language model asked a rubric question about each sample, its reply parsed into a score.

    {name: judge, model: Qwen/Qwen2.5-VL-7B-Instruct, rubric: "...", scale: [0, 10]}      # in process
    {name: judge, url: http://127.0.0.1:8000/v1, api_model: Qwen/Qwen2.5-VL-7B-Instruct,
     rubric: "...", choices: {"yes": 1.0, "no": 0.0}}                                   # OpenAI-compatible

The conversation is one user turn: the sample's input images, then its output image if it is one
(text-to-image) or `frames` evenly spaced frames of its output video (4 by default, the first and the last
included), then the rubric, a `str.format` template over `prompt`, `output` (the completion
text; "" for an image), `answer` and `meta` (`{meta[color]}`). The reply is parsed as a number
(`scale: [lo, hi]` maps lo..hi to 0..1, clipped; inside <answer>...</answer> when the reply has one,
else the first number in it) or, with `choices`, as the earliest of the choice words (whole words,
any case) and its value. A reply that does not parse scores None (unscorable, counted). Images are
resized to `image_size` [W, H] first when it is given. `output: text | image | video` judges only samples
whose output is a completion / an image / a video (the others score None; default `any`). Exactly one of
`model` (loaded once, on `device` in `dtype`) and `url` (`api_key` as a bearer token) says where the
model runs.
"""

from __future__ import annotations

import re
import string

from rewards.registry import register
from rewards.sample import Video, frame_indices

FIELDS = ("prompt", "output", "answer", "meta")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def check_rubric(rubric: str) -> str:
    if not isinstance(rubric, str) or not rubric.strip():
        raise ValueError(f"judge: rubric must be a non-empty template string, got {rubric!r}")
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(rubric) if f is not None]
    except ValueError as e:
        raise ValueError(f"judge: rubric {rubric!r} is not a valid template: {e}") from None
    for name in names:
        root = re.split(r"[.\[]", name, maxsplit=1)[0]
        if root not in FIELDS:
            raise ValueError(f"judge: rubric field {{{name}}} is not one of {', '.join(FIELDS)} "
                             "(use {meta[key]} for a dataset column)")
    return rubric


def parse_number(reply: str, lo: float, hi: float) -> float | None:
    found = _ANSWER.search(reply)
    match = _NUMBER.search(found.group(1) if found else reply)
    if match is None:
        return None
    return min(max((float(match.group()) - lo) / (hi - lo), 0.0), 1.0)


def parse_choice(reply: str, choices: dict) -> float | None:
    best = None
    for word, value in choices.items():
        m = re.search(rf"(?<!\w){re.escape(str(word))}(?!\w)", reply, re.IGNORECASE)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), float(value))
    return None if best is None else best[1]


def _check_parse(scale, choices) -> None:
    if choices is not None:
        if not isinstance(choices, dict) or not choices:
            raise ValueError(f"judge: choices must be a mapping word -> score, got {choices!r}")
        for word, value in choices.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"judge: choices[{word!r}] must be a number, got {value!r}")
        return
    if (not isinstance(scale, (list, tuple)) or len(scale) != 2
            or not all(isinstance(v, (int, float)) for v in scale) or scale[0] == scale[1]):
        raise ValueError(f"judge: scale must be [lo, hi] with lo != hi, got {scale!r}")


OUTPUTS = ("any", "text", "image", "video")


def validate(rubric=None, model=None, url=None, scale=None, choices=None, image_size=None, output="any",
             frames=4, **_) -> None:
    """The checks a judge entry passes before anything is loaded (run when the config is loaded)."""
    if output not in OUTPUTS:
        raise ValueError(f"judge: output must be one of {', '.join(OUTPUTS)} (what it judges), got {output!r}")
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise ValueError(f"judge: frames must be an integer >= 1 (frames of a video shown), got {frames!r}")
    if rubric is None:
        raise ValueError("judge: rubric is required (the question asked about each sample)")
    check_rubric(rubric)
    _check_parse([0, 10] if scale is None else scale, choices)
    if (model is None) == (url is None):
        raise ValueError("judge: give exactly one of model (a local transformers model) and url (an "
                         "OpenAI-compatible endpoint such as http://127.0.0.1:8000/v1)")
    if url is not None and not str(url).startswith(("http://", "https://")):
        raise ValueError(f"judge: url must start with http:// or https://, got {url!r}")
    if image_size is not None and (not isinstance(image_size, (list, tuple)) or len(image_size) != 2
                                   or min(image_size) < 1):
        raise ValueError(f"judge: image_size must be [W, H] with positive sides, got {image_size!r}")


@register("judge", factory=True)
def judge(rubric: str, model: str | None = None, url: str | None = None, api_model: str = "",
          api_key: str | None = None, scale: list | None = None, choices: dict | None = None,
          max_new_tokens: int = 16, batch_size: int = 1, device: str = "cpu", dtype: str = "float32",
          image_size: list | None = None, request_timeout_s: float = 60.0, retries: int = 2,
          max_concurrency: int = 4, output: str = "any", frames: int = 4):
    """VLM-as-judge: a rubric question about each sample, its reply parsed into a score (factory)."""
    from rewards.judge_backends import ChatEndpoint, LocalVLM

    validate(rubric, model, url, scale, choices, image_size, output, frames)
    scale = [0, 10] if scale is None else scale
    backend = (LocalVLM(model, device, dtype, max_new_tokens, batch_size) if model is not None else
               ChatEndpoint(url, api_model, api_key, max_new_tokens, request_timeout_s, retries, max_concurrency))

    def parse(reply: str | None) -> float | None:
        if reply is None:
            return None
        return parse_choice(reply, choices) if choices is not None else parse_number(reply, *map(float, scale))

    def score(samples: list) -> list:
        judged = [i for i, s in enumerate(samples) if _judges(output, s.output)]
        replies = backend.reply([(_images(samples[i], image_size, frames), _question(rubric, samples[i]))
                                 for i in judged])
        out = [None] * len(samples)                                         # other outputs: not judged
        for i, reply in zip(judged, replies):
            out[i] = parse(reply)
        return out

    score.backend = backend
    return score


judge.mmrl_validate = validate


def _judges(output: str, value) -> bool:
    if output == "text":
        return isinstance(value, str)
    if output == "image":
        from PIL import Image

        return isinstance(value, Image.Image)
    if output == "video":
        return isinstance(value, Video)
    return True


def _question(rubric: str, s) -> str:
    output = s.output if isinstance(s.output, str) else ""
    return rubric.format(prompt=s.prompt, output=output, answer=s.answer, meta=s.meta)


def _images(s, size, frames: int) -> list:
    from PIL import Image

    images = list(s.images) + ([s.output] if isinstance(s.output, Image.Image) else [])
    if isinstance(s.output, Video):
        images += [s.output.frames[k] for k in frame_indices(len(s.output), frames)]
    images = [im.convert("RGB") for im in images]
    return [im.resize(tuple(size), Image.BICUBIC) for im in images] if size else images
