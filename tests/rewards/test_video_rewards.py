"""Video rewards (rewards/builtin/video.py): an image reward lifted to a video's frames, by hand-computed tables."""

import pytest
from PIL import Image

import rewards
from rewards.sample import Sample, Video, frame_indices


def _brightness(samples):
    """An image reward: the red channel of the top-left pixel / 255 (None for a frame whose pixel is pure blue)."""
    out = []
    for s in samples:
        r, g, b = s.output.getpixel((0, 0))[:3]
        out.append(None if (r, g, b) == (0, 0, 255) else r / 255)
    return out


def _clip(reds, fps=8.0):
    return Video(frames=[Image.new("RGB", (4, 4), (r, 0, 0)) for r in reds], fps=fps)


@pytest.fixture
def frames_seen(monkeypatch):
    """Registers `brightness` (the image reward above) and records the ids of the frames it is given."""
    seen = []
    rewards.REGISTRY.names()                                   # the built-ins registered first

    def brightness(samples):
        seen.extend(s.id for s in samples)
        return _brightness(samples)

    monkeypatch.setitem(rewards.REGISTRY, "brightness",
                        rewards.registry.Entry("brightness", brightness, False, "test reward"))
    return seen


@pytest.mark.parametrize("n,k,want", [(9, 0, list(range(9))), (9, 3, [0, 4, 8]), (9, 8, [0, 1, 2, 3, 5, 6, 7, 8]),
                                      (5, 1, [0]), (5, 9, [0, 1, 2, 3, 4]), (33, 4, [0, 11, 21, 32])])
def test_frame_indices(n, k, want):
    assert frame_indices(n, k) == want


def test_per_frame_mean_and_min_by_hand(frames_seen):
    a, b = _clip([255, 51, 102]), _clip([0, 255])
    samples = [Sample("p", a, id="v0"), Sample("q", "a text answer", id="t"), Sample("r", b, id="v1")]
    mean = rewards.resolve("per_frame", {"reward": "brightness"})(samples)
    assert mean == pytest.approx([(1.0 + 0.2 + 0.4) / 3, None, 0.5]) and mean[1] is None
    assert frames_seen == ["v0 frame 0", "v0 frame 1", "v0 frame 2", "v1 frame 0", "v1 frame 1"]
    worst = rewards.resolve("per_frame", {"reward": "brightness", "reduce": "min"})(samples)
    assert worst == pytest.approx([0.2, None, 0.0]) and worst[1] is None


def test_per_frame_scores_evenly_spaced_frames(frames_seen):
    clip = _clip([0, 255, 255, 255, 51])                       # frames 0, 2, 4 of 5: 0, 1, 0.2
    got = rewards.resolve("per_frame", {"reward": "brightness", "frames": 3})([Sample("p", clip, id="v")])
    assert got == pytest.approx([0.4]) and frames_seen == ["v frame 0", "v frame 2", "v frame 4"]


def test_an_unscored_frame_leaves_the_video_unscored(frames_seen):
    clip = Video(frames=[Image.new("RGB", (4, 4), (255, 0, 0)), Image.new("RGB", (4, 4), (0, 0, 255))])
    assert rewards.resolve("per_frame", {"reward": "brightness"})([Sample("p", clip, id="v")]) == [None]


def test_frames_see_the_videos_prompt_answer_and_meta(monkeypatch):
    got = []
    rewards.REGISTRY.names()
    monkeypatch.setitem(rewards.REGISTRY, "record",
                        rewards.registry.Entry("record", lambda s: got.extend(s) or [1.0] * len(s), False, ""))
    rewards.resolve("per_frame", {"reward": "record"})([Sample("a cat", _clip([1, 2]), answer="x", meta={"m": 1}, id="v")])
    assert [(s.prompt, s.answer, s.meta, s.output.size) for s in got] == [("a cat", "x", {"m": 1}, (4, 4))] * 2


def test_image_rewards_on_frames_are_the_image_scores():
    """The built-in JPEG reward of each frame, averaged: the lifted score is the frames' mean score."""
    clip = Video(frames=[Image.effect_noise((16, 16), 60).convert("RGB"), Image.new("RGB", (16, 16), "white")])
    frames = [Sample("p", f) for f in clip.frames]
    each = rewards.resolve("jpeg_compressibility")(frames)
    lifted = rewards.resolve("per_frame", {"reward": "jpeg_compressibility"})([Sample("p", clip)])
    assert lifted == pytest.approx([sum(each) / 2]) and each[0] < each[1]


@pytest.mark.parametrize("kwargs,match", [({"reward": "brightness", "reduce": "median"}, "reduce must be one of mean, min"),
                                          ({"reward": "brightness", "frames": -1}, "frames must be an integer >= 0"),
                                          ({"reward": "no_such_reward"}, "its image reward 'no_such_reward'"),
                                          ({"reward": "jpeg_compressibility", "reward_kwargs": {"quality": 3}},
                                           "takes no argument 'quality'")])
def test_bad_entries_are_refused_before_anything_is_built(kwargs, match, frames_seen):
    with pytest.raises(ValueError, match=match):
        rewards.registry.check("per_frame", kwargs, field="rewards[0]")


def test_video_needs_frames():
    with pytest.raises(ValueError, match="at least one frame"):
        Video(frames=[])
    clip = _clip([1, 2, 3], fps=4)
    assert len(clip) == 3 and clip.size == (4, 4) and isinstance(clip.frames, tuple)
