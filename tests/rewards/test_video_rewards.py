"""Video rewards (rewards/builtin/video.py): an image reward lifted to a video's frames, by hand-computed tables;
the temporal-consistency rewards (CLIP cosine of consecutive frames, Farneback warp error) on hand-built clips
and a tiny random CLIP built in code (no download)."""

import sys

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

import rewards
from rewards.builtin import clip as clip_rewards
from rewards.builtin.video import warp_error
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


# ------------------------------------------------------------------------------------- temporal rewards
TINY_OPEN_CLIP = {                       # as tests/rewards/test_image_rewards.py: random init, no download
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
TINY = {"model": "mmrl-tiny-clip", "pretrained": None, "model_config": TINY_OPEN_CLIP}


def _ball(x, y=10, size=32):
    """A red disc of diameter 10 at (x, y) on a dark blue-grey background: smooth, textured enough for flow."""
    im = Image.new("RGB", (size, size), (20, 30, 60))
    ImageDraw.Draw(im).ellipse([x, y, x + 10, y + 10], fill=(220, 40, 40))
    return im


def _noise(seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8))


STILL = Video(frames=[_ball(8)] * 4)
BLANK = Video(frames=[Image.new("RGB", (32, 32), (0, 0, 0))] * 4)
MOVING = Video(frames=[_ball(4 + 2 * k) for k in range(5)])            # 2 px to the right per frame
GLITCH = Video(frames=[_ball(8), _ball(8), _noise(1), _ball(8)])      # one frame of noise


@pytest.fixture(scope="module")
def tclip():
    """reduce -> the tiny temporal_clip reward (weights seeded), built through the registry."""
    built = {}
    for reduce in ("mean", "min"):
        torch.manual_seed(0)
        built[reduce] = rewards.resolve("temporal_clip", {**TINY, "reduce": reduce, "batch_size": 3})
    return built


def _hand_cosines(video):
    """The cosines of consecutive frames' embeddings, from the same tiny model built directly, one call."""
    torch.manual_seed(0)
    net, preprocess, _ = clip_rewards._open_clip(**TINY, device="cpu", dtype="float32")
    with torch.no_grad():
        e, _ = clip_rewards._clip_embeds(net, preprocess, None, [Sample("p", f) for f in video.frames], "cpu",
                                         with_text=False)                                  # [F, D]
    return (e[:-1] * e[1:]).sum(-1).tolist()


def test_a_still_or_blank_clip_is_perfectly_consistent(tclip):
    warp = rewards.resolve("temporal_warp")
    assert warp([Sample("p", STILL), Sample("p", BLANK)]) == [0.0, 0.0]
    assert tclip["mean"]([Sample("p", STILL), Sample("p", BLANK)]) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert tclip["min"]([Sample("p", STILL)]) == pytest.approx([1.0], abs=1e-5)


def test_a_frame_of_noise_scores_worse_under_both(tclip):
    warp = rewards.resolve("temporal_warp")
    still, glitch = warp([Sample("p", STILL), Sample("p", GLITCH)])
    assert still == 0.0 and glitch < -0.1                   # two pairs of ~0.3 error out of three
    still, glitch = tclip["mean"]([Sample("p", STILL), Sample("p", GLITCH)])
    assert glitch < still - 0.01


def test_warp_reduce_mean_and_max_by_hand():
    pairs = [warp_error(a, b) for a, b in zip(GLITCH.frames, GLITCH.frames[1:])]
    assert pairs[0] == 0.0 and pairs[1] > 0.1 and pairs[2] > 0.1
    mean = rewards.resolve("temporal_warp", {"reduce": "mean"})([Sample("p", GLITCH)])
    worst = rewards.resolve("temporal_warp", {"reduce": "max"})([Sample("p", GLITCH)])
    assert mean == pytest.approx([-sum(pairs) / 3]) and worst == [-max(pairs)] and worst[0] < mean[0]


def test_clip_reduce_mean_and_min_by_hand(tclip):
    pairs = _hand_cosines(GLITCH)
    assert pairs[0] == pytest.approx(1.0, abs=1e-5) and min(pairs) < 0.99
    assert tclip["mean"]([Sample("p", GLITCH)]) == pytest.approx([sum(pairs) / 3], abs=1e-5)
    assert tclip["min"]([Sample("p", GLITCH)]) == pytest.approx([min(pairs)], abs=1e-5)


def test_warp_error_of_flat_frames_is_their_colour_difference():
    """Flat frames: whatever the flow, the warp of a flat frame is itself, so the error is |a - b| / 255 averaged
    over channels. A slow fade (10 grey levels a frame) costs 10/255 a pair: the reward is nearly blind to it."""
    black, orange = Image.new("RGB", (32, 32), (0, 0, 0)), Image.new("RGB", (32, 32), (255, 51, 0))
    assert warp_error(black, orange) == pytest.approx((1.0 + 0.2 + 0.0) / 3)
    fade = Video(frames=[Image.new("RGB", (32, 32), (g, g, g)) for g in (0, 10, 20, 30)])
    assert rewards.resolve("temporal_warp")([Sample("p", fade)]) == pytest.approx([-10 / 255])


def test_a_translated_shape_warps_well_and_shuffled_noise_does_not():
    """Farneback follows a disc moving 2 px a frame: the warp explains the motion (error 0 here); the same frames
    shuffled, with noise frames between them, cannot be explained."""
    shuffled = Video(frames=[MOVING.frames[3], _noise(2), MOVING.frames[0], _noise(3), MOVING.frames[4]])
    assert [warp_error(MOVING.frames[0], MOVING.frames[1])] == pytest.approx([0.0], abs=0.01)
    moving, bad = rewards.resolve("temporal_warp", {"reduce": "max"})([Sample("p", MOVING), Sample("p", shuffled)])
    assert -0.01 <= moving <= 0.0 and bad < -0.2
    # without the flow (a still warp) the moving disc costs something: the flow is doing the work
    a, b = (np.asarray(MOVING.frames[k], dtype=np.float32) for k in (0, 1))
    assert np.abs(a - b).mean() / 255 > 10 * max(-moving, 1e-4)


def test_temporal_rewards_pick_evenly_spaced_frames(tclip):
    """frames: 3 of 5 are frames 0, 2, 4: the noise at 1 and 3 is never seen."""
    clip = Video(frames=[_ball(8), _noise(4), _ball(8), _noise(5), _ball(8)])
    assert rewards.resolve("temporal_warp", {"frames": 3})([Sample("p", clip)]) == [0.0]
    assert rewards.resolve("temporal_warp", {"frames": 0})([Sample("p", clip)])[0] < -0.1
    torch.manual_seed(0)
    picked = rewards.resolve("temporal_clip", {**TINY, "frames": 3, "reduce": "min"})([Sample("p", clip)])
    assert picked == pytest.approx([1.0], abs=1e-5) and tclip["min"]([Sample("p", clip)])[0] < 0.99


def test_non_videos_and_single_frames_score_none(tclip):
    samples = [Sample("p", "a text answer"), Sample("p", _ball(3)), Sample("p", Video(frames=[_ball(3)])),
               Sample("p", STILL)]
    assert rewards.resolve("temporal_warp")(samples) == [None, None, None, 0.0]
    got = tclip["mean"](samples)
    assert got[:3] == [None, None, None] and got[3] == pytest.approx(1.0, abs=1e-5)
    assert tclip["mean"]([]) == [] and rewards.resolve("temporal_warp")([]) == []


def test_a_videos_score_does_not_depend_on_its_batch(tclip, monkeypatch):
    """batch_size 3: alone, GLITCH's 4 frames fill calls [0 1 2] [3 pad pad]; after MOVING's 5 they are split
    [.. .. 0] [1 2 3]; the scores are the same bit for bit, and every CLIP call embeds exactly 3 frames."""
    from rewards.builtin import video

    rows, embeds = [], video._clip_embeds
    monkeypatch.setattr(video, "_clip_embeds", lambda net, pre, tok, batch, *a, **k: rows.append(len(batch)) or
                        embeds(net, pre, tok, batch, *a, **k))
    warp = rewards.resolve("temporal_warp")
    for reward in (tclip["mean"], tclip["min"], warp):
        alone = reward([Sample("p", GLITCH)])
        among = reward([Sample("p", MOVING), Sample("q", "text"), Sample("p", GLITCH), Sample("p", STILL)])
        assert among[2] == alone[0] and among[0] == reward([Sample("p", MOVING)])[0]
    assert rows and set(rows) == {3}


@pytest.mark.parametrize("name,kwargs,match", [
    ("temporal_clip", {"reduce": "max"}, "reward 'temporal_clip': reduce must be one of mean, min"),
    ("temporal_clip", {"frames": 1}, "reward 'temporal_clip': frames must be 0 .* or an integer >= 2"),
    ("temporal_clip", {"frames": -2}, "reward 'temporal_clip': frames must be 0"),
    ("temporal_clip", {"batch_size": 0}, "reward 'temporal_clip': batch_size must be an integer >= 1"),
    ("temporal_clip", {"batch_size": "8"}, "reward 'temporal_clip': batch_size must be an integer >= 1"),
    ("temporal_clip", {"dtype": "float8"}, "reward 'temporal_clip': dtype must be one of float32"),
    ("temporal_clip", {"model_config": {"embed_dim": 8}}, "reward 'temporal_clip': model_config must be"),
    ("temporal_clip", {"winsize": 5}, "reward 'temporal_clip' takes no argument 'winsize'"),
    ("temporal_warp", {"reduce": "min"}, "reward 'temporal_warp': reduce must be one of mean, max"),
    ("temporal_warp", {"frames": 1}, "reward 'temporal_warp': frames must be 0"),
    ("temporal_warp", {"levels": 0}, "reward 'temporal_warp': levels must be an integer >= 1"),
    ("temporal_warp", {"winsize": 2}, "reward 'temporal_warp': winsize must be an integer >= 3"),
    ("temporal_warp", {"batch_size": 4}, "reward 'temporal_warp' takes no argument 'batch_size'"),
])
def test_bad_temporal_entries_are_refused_before_anything_is_built(name, kwargs, match, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was built while checking a config entry")

    monkeypatch.setattr("rewards.builtin.video._open_clip", no_model)
    with pytest.raises(ValueError, match=r"config key 'rewards\[0\]': " + match):
        rewards.registry.check(name, kwargs, field="rewards[0]")
    rewards.registry.check(name, {k: v for k, v in {**TINY, "frames": 2, "reduce": "mean"}.items()
                                  if name == "temporal_clip" or k in ("frames", "reduce")})   # a good entry passes


def test_temporal_warp_without_opencv_names_the_video_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)              # `import cv2` raises ImportError
    with pytest.raises(ValueError, match=r'needs OpenCV: .*pip install -e "\.\[video\]"'):
        rewards.resolve("temporal_warp")
