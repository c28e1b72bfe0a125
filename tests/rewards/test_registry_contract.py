"""The reward contract, parametrized over every registered built-in (docs/guides/rewards.md: list[Sample] -> list[float | None]).

A newly registered reward fails here until it gets an entry in SPECS below.
"""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rewards.registry import registered, resolve
from rewards.sample import Sample


def _sibling(name):
    """Load a sibling test module by path (tests/ has no packages), for its tiny-model builders."""
    spec = importlib.util.spec_from_file_location(f"_mmrl_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tiny = _sibling("test_image_rewards")

# name -> (kind of samples it scores, assets dir -> kwargs)
SPECS = {
    "format": ("text", lambda d: {}),
    "math": ("text", lambda d: {}),
    "choice": ("text", lambda d: {}),
    "numeric": ("text", lambda d: {"abs_tol": 0.5}),
    "exact": ("text", lambda d: {"casefold": True}),
    "contains": ("text", lambda d: {}),
    "overlong": ("text", lambda d: {"max_length": 8, "buffer": 4}),
    "iou": ("box", lambda d: {"threshold": None}),
    "jpeg_compressibility": ("image", lambda d: {}),
    "jpeg_incompressibility": ("image", lambda d: {}),
    "per_frame": ("video", lambda d: {"reward": "jpeg_compressibility", "reduce": "min"}),
    "temporal_clip": ("video", lambda d: {**tiny.tiny_clip_kwargs(), "reduce": "min", "batch_size": 2}),
    "temporal_warp": ("video", lambda d: {"reduce": "max"}),
    "clip_score": ("image", lambda d: tiny.tiny_clip_kwargs()),
    "pickscore": ("image", lambda d: {"model": d["hf_clip"], "processor": d["hf_clip"]}),
    "hpsv2": ("image", lambda d: {"checkpoint": d["hps"], **tiny.tiny_clip_kwargs()}),
    "aesthetic": ("image", lambda d: {"checkpoint": d["mlp"], **tiny.tiny_clip_kwargs()}),
    "shapes_t2i": ("shapes_image", lambda d: {}),
    "shapes_stray": ("image", lambda d: {}),
    "shapes_motion": ("shapes_video", lambda d: {}),
    "shapes_motion_direction": ("shapes_video", lambda d: {}),
    "shapes_vlm": ("shapes_text", lambda d: {}),
    "env_return": ("episode", lambda d: {}),
    "env_success": ("episode", lambda d: {}),
    "judge": ("shapes_image", lambda d: {"model": str(Path(__file__).parents[2] / "assets" / "tiny" / "shapes_vlm"),
                                         "rubric": "How many {meta[color]} shapes are in the image? Reply as "
                                                   "<answer> answer </answer>.", "scale": [0, 3],
                                         "image_size": [112, 112], "max_new_tokens": 8, "output": "image"}),
    "remote": ("text", lambda d: {"url": d["format_server"]}),        # `format` behind a real server
}


def text_samples():
    return [Sample("pick one", "<think>t</think><answer>B</answer>", answer="B", meta={"options": ["x", "y"]}),
            Sample("add", "<think>t</think><answer>The sum is 12</answer>", answer="12", meta={"num_tokens": 7}),
            Sample("say", "plain text without tags 3", answer="three")]


def box_samples():
    resize = [{"original_size": [64, 48], "model_size": [32, 24]}]
    return [Sample("cat", "<answer>[0, 0, 10, 10]</answer>", answer=[0, 0, 20, 20], meta={"resize": resize}),
            Sample("dog", '{"bbox_2d": [1, 2, 3, 4]}', answer=[1, 2, 3, 4]),
            Sample("car", "no box here", answer=[0, 0, 1, 1])]


def image_samples():
    noise = np.random.default_rng(1).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    return [Sample("a red cat", Image.new("RGB", (24, 24), (220, 20, 20))),
            Sample("a photo of a dog", Image.fromarray(noise)),
            Sample("a blue dog", Image.new("L", (30, 18), 128))]


def video_samples():
    from rewards.sample import Video

    return [Sample(s.prompt, Video(frames=[s.output, s.output.rotate(90)])) for s in image_samples()]


def shapes_image_samples():
    from shapes_world.tasks import render_prompt, t2i_prompt_space

    specs = t2i_prompt_space()[:3]
    return [Sample(s["prompt"], render_prompt(s, i), meta=s) for i, s in enumerate(specs)]


def shapes_video_samples():
    from shapes_world.motion import render_clip, t2v_prompt_space

    specs = t2v_prompt_space()[:3]
    return [Sample(s["prompt"], render_clip(s, i), meta=s) for i, s in enumerate(specs)]


def shapes_text_samples():
    return [Sample("q", "<answer>2</answer>", answer="2", meta={"task": "count"}),
            Sample("q", "<answer>red</answer>", answer="blue", meta={"task": "attribute"}),
            Sample("q", "<answer>[0, 0, 4, 4]</answer>", answer=[0, 0, 8, 8], meta={"task": "grounding"})]


def episode_samples():
    return [Sample("walk", "left\nright", meta={"return": 1.0, "success": True}),
            Sample("walk", "up", meta={"return": -0.2, "success": False}),
            Sample("walk", "down\ndown", meta={"return": 0.0, "success": False})]


SAMPLES = {"text": text_samples, "box": box_samples, "image": image_samples, "video": video_samples,
           "shapes_image": shapes_image_samples, "shapes_video": shapes_video_samples, "shapes_text": shapes_text_samples, "episode": episode_samples}
OTHER_KIND = {"text": "image", "box": "image", "image": "text", "video": "image", "shapes_image": "text",
              "shapes_video": "shapes_image",
              "shapes_text": "image",
              "episode": "text"}


@pytest.fixture(scope="module")
def build(tmp_path_factory, serving):
    """name -> reward built through the registry, cached for the module (with tiny assets on disk
    and a reward server)."""
    root = tmp_path_factory.mktemp("reward_assets")
    with serving(resolve("format", {}), "format") as url:
        assets = {"hf_clip": tiny.hf_clip_folder(root / "hf_clip"),
                  "hps": tiny.hpsv2_checkpoint(root / "hps.pt", wrap=False),
                  "mlp": tiny.aesthetic_checkpoint(root / "mlp.pth"), "format_server": url}
        cache = {}

        def get(name):
            if name not in cache:
                cache[name] = resolve(name, SPECS[name][1](assets))
            return cache[name]

        yield get


def _check_scores(scores, n):
    assert isinstance(scores, list) and len(scores) == n
    for v in scores:
        assert v is None or (type(v) is float and math.isfinite(v)), f"score {v!r} is not a finite float or None"


# built-ins only: rewards registered by other test modules (dummies) are not part of this contract
NAMES = sorted(n for n, e in registered().items() if e.obj.__module__.startswith("rewards."))


def test_builtins_are_registered():
    assert {"format", "math", "iou", "jpeg_compressibility", "clip_score", "pickscore"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_contract(name, build):
    assert name in SPECS, f"registered reward {name!r} has no test kwargs: add it to SPECS in {Path(__file__).name}"
    kind = SPECS[name][0]
    reward = build(name)
    first = reward(SAMPLES[kind]())
    _check_scores(first, 3)
    assert any(v is not None for v in first), f"{name} scored none of its own kind of samples"
    assert reward(SAMPLES[kind]()) == first, f"{name} is not deterministic"


@pytest.mark.parametrize("name", NAMES)
def test_wrong_output_type_scores_none(name, build):
    assert name in SPECS, f"registered reward {name!r} has no test kwargs: add it to SPECS in {Path(__file__).name}"
    samples = [s for s in SAMPLES[OTHER_KIND[SPECS[name][0]]]() if "num_tokens" not in s.meta]
    assert build(name)(samples) == [None] * len(samples)


@pytest.mark.parametrize("name", NAMES)
def test_empty_batch(name, build):
    assert name in SPECS
    assert build(name)([]) == []


def test_episode_rewards_read_the_trajectory_meta():
    from rewards.registry import resolve

    samples = episode_samples()
    assert resolve("env_return", {})(samples) == [1.0, -0.2, 0.0]
    assert resolve("env_success", {})(samples) == [1.0, 0.0, 0.0]
