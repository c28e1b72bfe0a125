"""Fixtures of the reward tests: real HTTP servers. The FastAPI app under uvicorn in a thread (`serving`),
a scripted stdlib server that fails, sleeps and counts (`make_script`, `scripted`), `mmrl rewards serve` as
a subprocess (`start_cli_server`) and an OpenAI-compatible chat server for the judge (`chat_server`). The
factories hold no state, so most are session-scoped (module-scoped fixtures use them)."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rewards.server import create_app, listen, make_server


@contextlib.contextmanager
def _serving(reward, name: str = "reward", **app_kwargs):
    sock = listen("127.0.0.1", 0)
    server = make_server(create_app(reward, name, **app_kwargs), log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the reward server thread ended before it started")
            thread.join(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="session")
def serving():
    """`with serving(reward, name="reward", **app_kwargs) as url:` `reward` served by the real app on a
    free port of 127.0.0.1; yields the base URL."""
    return _serving


class Script:
    """What a scripted server answers to POST /score: `answer(n, samples) -> (status, payload)`, where
    `n` counts POST requests from 1; GET /health always answers 200. Records every POST's samples."""

    def __init__(self, answer, sleep: threading.Event | None = None):
        self.answer, self.sleep = answer, sleep
        self.posts: list[list[dict]] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()


@pytest.fixture(scope="session")
def make_script():
    """`make_script(answer, sleep=None)`: a Script (what a scripted server answers, and what it was sent)."""
    return Script


def send_json(handler: BaseHTTPRequestHandler, status: int, payload) -> None:
    """Answer a stdlib server's request with `payload` as JSON."""
    body = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextlib.contextmanager
def _scripted(script: Script):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, status: int, payload) -> None:
            send_json(self, status, payload)

        def do_GET(self):
            self._send(200, {"status": "ok", "reward": "scripted"})

        def do_POST(self):
            samples = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["samples"]
            with script.lock:
                script.posts.append(samples)
                n = len(script.posts)
                script.in_flight += 1
                script.max_in_flight = max(script.max_in_flight, script.in_flight)
            try:
                status, payload = script.answer(n, samples)
                if script.sleep is not None:
                    script.sleep.wait(2.0)        # until the test sets it, or 2 s
                self._send(status, payload)
            except (BrokenPipeError, ConnectionResetError):   # the client gave up (its timeout)
                pass
            finally:
                with script.lock:
                    script.in_flight -= 1

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        if script.sleep is not None:
            script.sleep.set()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def scripted():
    """`with scripted(script) as url:` a stdlib HTTP server playing `script` (a `make_script(...)`) on a
    free port; yields the base URL."""
    return _scripted


@pytest.fixture(scope="session")
def ones():
    """A script answer: 1.0 for every sample."""
    return lambda n, samples: (200, {"scores": [1.0] * len(samples)})


@pytest.fixture
def start_cli_server(mmrl_cmd):
    """`start_cli_server(*args, port=0)`: `mmrl rewards serve ARGS --port PORT` as a subprocess;
    (process, base URL) once it listens."""

    def start(*args: str, port: int = 0) -> tuple[subprocess.Popen, str]:
        proc = subprocess.Popen(mmrl_cmd("rewards", "serve", *args, "--port", str(port)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = proc.stdout.readline()          # "mmrl: serving reward ... on http://127.0.0.1:PORT ..."
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not found:
            proc.kill()
            raise RuntimeError(f"mmrl rewards serve did not start: {line}{proc.stderr.read()[-2000:]}")
        return proc, found.group(0)

    return start


def _image(url: str):
    from PIL import Image

    head, _, data = url.partition(",")
    if not head.startswith("data:image/"):
        raise ValueError(f"not an image data URL: {head[:40]!r}")
    return Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")


class _Server(ThreadingHTTPServer):
    daemon_threads = False        # server_close() waits for requests in flight (a model call must not be cut)


class ChatServer:
    """`with ChatServer(backend, token=None, fail_first=0) as s:` serves at `s.url` (".../v1"). The first
    `fail_first` requests get 503 (`s.failed`); without the bearer `token` a request gets 401
    (`s.refused`); every request waits `delay_s` first; the bodies of the requests answered are kept in
    `s.requests`."""

    def __init__(self, backend, token: str | None = None, fail_first: int = 0, delay_s: float = 0.0):
        self.backend, self.token, self.fail_first, self.delay_s = backend, token, fail_first, delay_s
        self.requests, self.failed, self.refused = [], 0, 0
        self._lock = threading.Lock()                                         # one model call at a time
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):                                     # quiet
                pass

            def _send(self, code: int, payload: dict) -> None:
                send_json(self, code, payload)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                time.sleep(server.delay_s)
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": f"no route {self.path}"})
                if server.token and self.headers.get("Authorization") != f"Bearer {server.token}":
                    with server._lock:
                        server.refused += 1
                    return self._send(401, {"error": "missing or wrong bearer token"})
                with server._lock:
                    if server.failed < server.fail_first:
                        server.failed += 1
                        return self._send(503, {"error": "warming up"})
                    server.requests.append(body)
                    content = body["messages"][0]["content"]
                    images = [_image(c["image_url"]["url"]) for c in content if c["type"] == "image_url"]
                    text = "".join(c["text"] for c in content if c["type"] == "text")
                    reply = server.backend.reply([(images, text)])[0]
                self._send(200, {"object": "chat.completion", "model": body.get("model", ""),
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": reply}}]})

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture(scope="session")
def chat_server():
    """`with chat_server(backend, token=None, fail_first=0, delay_s=0.0) as s:` a real OpenAI-compatible
    chat-completions server (stdlib `http.server` on 127.0.0.1 in a thread) answering POST
    /v1/chat/completions with `backend`'s reply (a real model), the way `vllm serve` answers: images from
    PNG data URLs, the text part as the question (see ChatServer)."""
    return ChatServer
