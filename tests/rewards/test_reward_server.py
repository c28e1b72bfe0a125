"""`mmrl rewards serve`'s app (rewards/server.py) over real HTTP: exact scores through the `remote`
reward, health, auth, size cap, schema errors, failing rewards, one reward thread."""

import base64
import io
import json
import subprocess
import threading

import httpx
import numpy as np
import pytest
from PIL import Image

from rewards.registry import resolve
from rewards.sample import Sample
from rewards.server import listen
from shapes_world.tasks import render_prompt, t2i_records
from tests import REPO

TEXT = [Sample("1+1?", "<think>easy</think><answer>2</answer>", answer="2", id="a"),
        Sample("x?", "<answer>3/7</answer>", answer="0.428571", id="b"),
        Sample("y?", "the numbers 1 2 3.5 are small", answer="\\frac{1}{3}", id="c"),
        Sample("z?", "no answer", answer=None, id="d"),
        Sample("w?", "<answer>\\frac{2}{6}</answer>", answer="1/3", meta={"k": [1, 2]}, id="e")]


def _remote(url: str, **kw):
    return resolve("remote", {"url": url, "batch_size": 2, "backoff_s": 0.01, **kw})


@pytest.mark.parametrize("name, kwargs", [("math", {}), ("format", {}),
                                          (f"{REPO}/examples/my_reward.py:small_numbers", {"scale": 7})])
def test_remote_scores_equal_the_local_reward_exactly_for_text(name, kwargs, serving):
    local = resolve(name, kwargs)
    with serving(resolve(name, kwargs), name) as url:
        got = _remote(url)(TEXT)
    want = local(TEXT)
    assert got == want and any(v is not None for v in want)
    assert [type(v) for v in got] == [type(v) for v in want]


def _image_reward_file(tmp_path) -> str:
    path = tmp_path / "pixels.py"
    path.write_text("import numpy as np\n"
                    "def pixels(samples):\n"
                    "    return [float(np.asarray(s.output, dtype=np.float64).mean() / 7.0 + 1000 * len(s.images)\n"
                    "                  + sum(np.asarray(im, dtype=np.float64).std() for im in s.images)) for s in samples]\n")
    return f"{path}:pixels"


def test_remote_scores_equal_the_local_reward_exactly_for_images(tmp_path, serving):
    specs = t2i_records("train")[:5]
    noisy = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8))
    samples = [Sample(s["prompt"], render_prompt(s, seed=i), images=[noisy] * (i % 2), meta=s, id=str(i))
               for i, s in enumerate(specs)]
    samples.append(Sample("p", Image.new("L", (16, 16), 77), meta=specs[0], id="grey"))
    for name in ("shapes_t2i", _image_reward_file(tmp_path)):
        with serving(resolve(name, {}), name) as url:
            got = _remote(url)(samples)
        assert got == resolve(name, {})(samples), name
    assert len(set(got)) == len(samples)          # the plug-in's scores tell every image apart


def test_remote_scores_equal_the_local_reward_exactly_for_videos(tmp_path, serving):
    """A video's frames travel as PNGs with its fps: the served per-frame reward scores what the local one does."""
    from rewards.sample import Video

    specs = t2i_records("train")[:3]
    clips = [Video(frames=[render_prompt(s, seed=i + k) for k in range(3)], fps=8) for i, s in enumerate(specs)]
    samples = [Sample(s["prompt"], c, meta=s, id=str(i)) for i, (s, c) in enumerate(zip(specs, clips))]
    name, kwargs = "per_frame", {"reward": _image_reward_file(tmp_path), "reduce": "min"}
    with serving(resolve(name, kwargs), name) as url:
        got = _remote(url)(samples)
    assert got == resolve(name, kwargs)(samples) and len(set(got)) == 3


def test_health_and_token(serving):
    with serving(lambda s: [1.0] * len(s), "ones", token="s3cret") as url:
        body = {"samples": [{"output": {"text": "x"}}]}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            assert httpx.get(url + "/health", headers=headers).status_code == 401
            refused = httpx.post(url + "/score", json=body, headers=headers)
            assert refused.status_code == 401 and "Bearer" in refused.json()["detail"]
        ok = {"Authorization": "Bearer s3cret"}
        assert httpx.get(url + "/health", headers=ok).json() == {"status": "ok", "reward": "ones"}
        assert httpx.post(url + "/score", json=body, headers=ok).json()["scores"] == [1.0]
        with pytest.raises(ValueError, match=f"config key 'url'.*{url}/health.*401"):
            _remote(url, retries=0)
        assert _remote(url, token="s3cret")([Sample("", "x")]) == [1.0]


def _png_b64(size: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def test_a_body_over_the_cap_is_413_declared_or_chunked(serving):
    with serving(lambda s: [1.0] * len(s), "ones", max_request_bytes=20_000) as url:
        big = json.dumps({"samples": [{"output": {"image_png_b64": _png_b64(128)}}]}).encode()   # ~66 kB
        small = json.dumps({"samples": [{"output": {"image_png_b64": _png_b64(8)}}]}).encode()
        declared = httpx.post(url + "/score", content=big)
        assert declared.status_code == 413 and "--max-request-mb" in declared.json()["detail"]
        chunked = httpx.post(url + "/score", content=iter([big[:15_000], big[15_000:]]))   # no Content-Length
        assert chunked.status_code == 413
        assert httpx.post(url + "/score", content=small).json()["scores"] == [1.0]


BAD_BODIES = [
    (b"{\"samples\": [", 400, "not JSON"),
    (b"[1, 2]", 422, "samples: missing"),
    (b"{\"samples\": {}}", 422, "samples: expected a list"),
    (b"{\"samples\": [{\"output\": {\"text\": \"ok\"}}, {\"output\": \"bare\"}]}", 422, "samples[1].output: expected"),
    (b"{\"samples\": [{\"prompt\": \"p\"}]}", 422, "samples[0].output: missing"),
    (b"{\"samples\": [{\"output\": {\"text\": \"x\"}, \"images\": [\"@@@\"]}]}", 422, "samples[0].images[0]: not valid base64"),
    (b"{\"samples\": [{\"output\": {\"image_png_b64\": \"aGVsbG8=\"}}]}", 422, "samples[0].output.image_png_b64: not a readable image"),
    (b"{\"samples\": [{\"output\": {\"text\": \"x\"}, \"meta\": [1]}]}", 422, "samples[0].meta: expected dict"),
    (b"{\"samples\": [{\"output\": {\"video_png_b64\": [], \"fps\": 8}}]}", 422,
     "samples[0].output.video_png_b64: expected a non-empty list"),
    (b"{\"samples\": [{\"output\": {\"video_png_b64\": [\"aGVsbG8=\"], \"fps\": 0}}]}", 422,
     "samples[0].output.fps: expected a number > 0"),
    (b"{\"samples\": [{\"output\": {\"text\": \"x\"}, \"scores\": 1}]}", 422, "samples[0]: unknown field(s) 'scores'"),
]


@pytest.mark.parametrize("body, status, message", BAD_BODIES, ids=[m for _, _, m in BAD_BODIES])
def test_schema_errors_name_the_field(body, status, message, serving):
    with serving(lambda s: [1.0] * len(s), "ones") as url:
        r = httpx.post(url + "/score", content=body)
        assert r.status_code == status and message in r.json()["detail"], r.text


def _flaky(samples):
    if any("boom" in s.output for s in samples):
        raise ZeroDivisionError("boom in " + ",".join(s.id for s in samples))
    return [float(len(s.output)) for s in samples]


def test_a_raising_reward_costs_only_its_samples_and_a_broken_one_is_500(serving):
    with serving(_flaky, "flaky") as url:
        samples = [{"id": str(i), "output": {"text": t}} for i, t in enumerate(["ab", "boom", "abc"])]
        r = httpx.post(url + "/score", json={"samples": samples}).json()
        assert r == {"scores": [2.0, None, 3.0], "errors": [None, "ZeroDivisionError: boom in 1", None]}
    with serving(lambda s: [1.0], "short") as url:
        broken = httpx.post(url + "/score", json={"samples": samples})
        assert broken.status_code == 500 and "returned 1 scores for 3 samples" in broken.json()["detail"]
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.post(url + "/score", json={"samples": samples[:1]}).json()["scores"] == [1.0]


def test_the_reward_runs_on_one_thread_one_call_at_a_time(serving):
    seen, lock, state = set(), threading.Lock(), {"now": 0, "max": 0}

    def reward(samples):
        with lock:
            seen.add(threading.get_ident())
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        threading.Event().wait(0.01)
        with lock:
            state["now"] -= 1
        return [0.5] * len(samples)

    with serving(reward, "slow") as url:
        remote = _remote(url, batch_size=1, max_concurrency=8)
        assert remote([Sample("", str(i)) for i in range(16)]) == [0.5] * 16
    assert len(seen) == 1 and state["max"] == 1


@pytest.mark.integration
def test_the_serve_command_refuses_a_bad_reward_or_a_taken_port(mmrl_cmd, in_background):
    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        unknown, busy = (in_background(subprocess.run, mmrl_cmd("rewards", "serve", *args), capture_output=True,
                                       text=True, timeout=120)                                 # side by side
                         for args in (["nope"], ["format", "--port", str(port)]))
        unknown, busy = unknown.result(), busy.result()
    finally:
        taken.close()
    assert unknown.returncode == 2 and "valid names: " in unknown.stderr and "Traceback" not in unknown.stderr
    assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
