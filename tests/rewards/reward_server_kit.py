"""Real HTTP servers for the reward-server tests: the FastAPI app under uvicorn in a thread, a
scripted stdlib server (fails, sleeps, counts), and `mmrl rewards serve` as a subprocess."""

import contextlib
import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rewards.server import create_app, listen, make_server
from testkit import mmrl_cmd


@contextlib.contextmanager
def serving(reward, name: str = "reward", **app_kwargs):
    """`reward` served by the real app on a free port of 127.0.0.1; yields the base URL."""
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


class Script:
    """What a scripted server answers to POST /score: `answer(n, samples) -> (status, payload)`, where
    `n` counts POST requests from 1; GET /health always answers 200. Records every POST's samples."""

    def __init__(self, answer, sleep: threading.Event | None = None):
        self.answer, self.sleep = answer, sleep
        self.posts: list[list[dict]] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()


def send_json(handler: BaseHTTPRequestHandler, status: int, payload) -> None:
    """Answer a stdlib server's request with `payload` as JSON."""
    body = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextlib.contextmanager
def scripted(script: Script):
    """A stdlib HTTP server playing `script` on a free port; yields the base URL."""

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


def ones(n, samples):
    """A script answer: 1.0 for every sample."""
    return 200, {"scores": [1.0] * len(samples)}


def start_cli_server(*args: str, port: int = 0) -> tuple[subprocess.Popen, str]:
    """`mmrl rewards serve ARGS --port PORT` as a subprocess; (process, base URL) once it listens."""
    proc = subprocess.Popen(mmrl_cmd("rewards", "serve", *args, "--port", str(port)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()          # "mmrl: serving reward ... on http://127.0.0.1:PORT ..."
    found = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not found:
        proc.kill()
        raise RuntimeError(f"mmrl rewards serve did not start: {line}{proc.stderr.read()[-2000:]}")
    return proc, found.group(0)
