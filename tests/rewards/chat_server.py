"""A real OpenAI-compatible chat-completions server for the judge tests: stdlib `http.server` on 127.0.0.1
in a thread, answering POST /v1/chat/completions with a judge backend's reply (a real model), the way
`vllm serve` answers: images from PNG data URLs, the text part as the question."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from reward_server_kit import send_json


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
