"""`judge`: a VLM asked a rubric question about each sample. The tiny shapes VLM of the CPU default names
the colour in shapes scenes, in process and behind a real OpenAI-compatible HTTP server (the `chat_server` fixture),
with the same scores; parsing tables; config errors; retries, 4xx and a dead endpoint."""

from __future__ import annotations

import os

import pytest

from rewards.judge import parse_choice, parse_number
from rewards.registry import LookupFailed, check, resolve
from rewards.sample import Sample
from tests import REPO

MODEL = os.path.join(REPO, "assets", "tiny", "shapes_vlm")
RUBRIC = "{prompt} Reply as <answer> answer </answer>."
SIZE = [112, 112]                       # the CPU default's image size (16 image tokens)


COLOURS = {"red": 0.0, "green": 0.25, "blue": 0.5, "yellow": 1.0}   # a colour question's reply -> a score


def _scenes(n=6, task="count"):
    from shapes_world.tasks import vlm_records

    return [Sample(prompt=r["prompt"], output="", images=r["images"], answer=r["answer"], id=f"scene {i}")
            for i, r in enumerate(vlm_records(n=n, split="eval", tasks=[task], size=56, max_objects=3))]


@pytest.mark.parametrize("reply,expected", [
    ("<answer> 2 </answer>", 0.2), ("I count 3 and then 4", 0.3), ("<answer>7</answer> 1", 0.7),
    ("-5", 0.0), ("15", 1.0), ("2.5", 0.25), ("none", None), ("<answer>x</answer> 4", None)])
def test_number_replies_map_lo_hi_to_0_1(reply, expected):
    assert parse_number(reply, 0.0, 10.0) == expected


@pytest.mark.parametrize("reply,expected", [
    ("Yes.", 1.0), ("no, yes", 0.0), ("YES it is", 1.0), ("yesterday", None), ("maybe", 0.5), ("", None)])
def test_choice_replies_take_the_earliest_whole_word(reply, expected):
    assert parse_choice(reply, {"yes": 1.0, "no": 0.0, "maybe": 0.5}) == expected


@pytest.mark.parametrize("kwargs,message", [
    ({"url": "http://x"}, "rubric is required"),
    ({"rubric": "{foo}", "url": "http://x"}, r"rubric field \{foo\} is not one of prompt, output, answer, meta"),
    ({"rubric": "q", "url": "http://x", "model": MODEL}, "exactly one of model"),
    ({"rubric": "q"}, "exactly one of model"),
    ({"rubric": "q", "url": "ftp://x"}, "url must start with http"),
    ({"rubric": "q", "url": "http://x", "scale": [1, 1]}, r"scale must be \[lo, hi\]"),
    ({"rubric": "q", "url": "http://x", "choices": {"yes": "1"}}, r"choices\['yes'\] must be a number"),
    ({"rubric": "q", "url": "http://x", "image_size": [0, 4]}, "image_size must be"),
    ({"rubric": "q", "url": "http://x", "temperature": 1}, "takes no argument 'temperature'")])
def test_config_errors_are_found_before_anything_loads(kwargs, message):
    with pytest.raises(LookupFailed, match=message):
        check("judge", kwargs, "rewards[0].name")


@pytest.fixture(scope="module")
def local():
    return resolve("judge", {"model": MODEL, "rubric": RUBRIC, "choices": COLOURS, "image_size": SIZE,
                             "max_new_tokens": 8})


def test_the_local_judge_asks_one_conversation_per_call_by_default(local):
    """A reply must not depend on the other samples of the step (nor on how the step is split over processes):
    by default each conversation is its own call, so the batch's scores are the scores asked one by one."""
    assert local.backend.batch_size == 1
    samples = _scenes()
    assert local(samples) == [local([s])[0] for s in samples]


def test_local_judge_scores_what_the_model_replies(local):
    """Each score is the parse of the model's own greedy reply to the rendered question (transformers,
    asked directly); the tiny model names different colours for different scenes (scores differ; it
    answers "2" to every count question, the biased teacher's answer the CPU default trains away)."""
    samples = _scenes(task="attribute")
    scores = local(samples)
    backend = local.backend
    questions = [([im.resize(tuple(SIZE)) for im in s.images], RUBRIC.format(prompt=s.prompt)) for s in samples]
    replies = [backend.reply([q])[0] for q in questions]
    assert scores == [parse_choice(r, COLOURS) for r in replies]
    assert all(s is not None for s in scores) and len(set(scores)) > 1, (replies, scores)


def test_endpoint_judge_gives_the_local_scores_through_a_real_chat_server(local, chat_server):
    """The same model behind an OpenAI-compatible /v1/chat/completions server: images as PNG data URLs,
    temperature 0, the bearer token sent; the scores equal the in-process judge's."""
    samples = _scenes(task="attribute")
    with chat_server(local.backend, token="secret") as server:
        remote = resolve("judge", {"url": server.url, "api_model": "shapes", "api_key": "secret",
                                   "rubric": RUBRIC, "choices": COLOURS, "image_size": SIZE, "max_new_tokens": 8})
        assert remote(samples) == local(samples)
        assert len(server.requests) == len(samples)                          # concurrent: in any order
        for body in server.requests:
            assert body["model"] == "shapes" and body["temperature"] == 0 and body["max_tokens"] == 8
            image, text = body["messages"][0]["content"]
            assert image["type"] == "image_url" and image["image_url"]["url"].startswith("data:image/png;base64,")
            assert text["type"] == "text"
        asked = sorted(body["messages"][0]["content"][1]["text"] for body in server.requests)
        assert asked == sorted(RUBRIC.format(prompt=s.prompt) for s in samples)


def test_a_video_is_judged_on_evenly_spaced_frames(local, chat_server):
    """A video output: `frames` of its frames (first and last included) follow the input images, in order, as
    PNGs; `output: video` judges only videos. Scores equal the in-process judge asked the same conversation."""
    from rewards.sample import Video

    scenes = _scenes(3, task="attribute")
    clip = Video(frames=[scenes[0].images[0], scenes[1].images[0], scenes[2].images[0], scenes[1].images[0],
                         scenes[2].images[0]], fps=4)
    video = Sample(prompt=scenes[2].prompt, output=clip, id="clip")
    entry = {"rubric": RUBRIC, "choices": COLOURS, "image_size": SIZE, "max_new_tokens": 8, "output": "video",
             "frames": 3}
    with chat_server(local.backend) as server:
        got = resolve("judge", {"url": server.url, **entry})([video, scenes[0]])
        (body,) = server.requests
    content = body["messages"][0]["content"]
    assert [part["type"] for part in content] == ["image_url"] * 3 + ["text"]   # frames 0, 2, 4 of 5
    picked = [clip.frames[k].resize(tuple(SIZE)) for k in (0, 2, 4)]
    assert got == [parse_choice(local.backend.reply([(picked, RUBRIC.format(prompt=video.prompt))])[0], COLOURS), None]
    with pytest.raises(LookupFailed, match="frames must be an integer >= 1"):
        check("judge", {**entry, "url": "http://x", "frames": 0}, "rewards[0].name")


def test_a_request_slower_than_its_timeout_is_retried_then_unscorable(local, chat_server):
    samples = _scenes(2)
    with chat_server(local.backend, delay_s=1.5) as server:
        judge = resolve("judge", {"url": server.url, "rubric": RUBRIC, "request_timeout_s": 0.1, "retries": 1})
        with pytest.raises(RuntimeError, match="every request failed"):
            judge(samples)


def test_endpoint_retries_5xx_not_4xx_and_a_dead_endpoint_names_its_url(local, chat_server):
    samples = _scenes(2, task="attribute")
    with chat_server(local.backend, fail_first=2) as server:                 # two 503s, then answers
        judge = resolve("judge", {"url": server.url, "rubric": RUBRIC, "choices": COLOURS, "image_size": SIZE,
                                  "retries": 2, "max_concurrency": 1, "max_new_tokens": 8})
        assert judge(samples) == local(samples) and None not in judge(samples) and server.failed == 2
    with chat_server(local.backend, token="secret") as server:               # 401: not retried, unscorable
        judge = resolve("judge", {"url": server.url, "rubric": RUBRIC, "retries": 3})
        with pytest.raises(RuntimeError, match=f"judge endpoint {server.url}/chat/completions"):
            judge(samples)
        assert len(server.requests) == 0 and server.refused == 2
    judge = resolve("judge", {"url": server.url, "rubric": RUBRIC, "retries": 1})    # server gone
    with pytest.raises(RuntimeError, match="every request failed"):
        judge(samples)
