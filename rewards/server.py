"""`mmrl rewards serve REWARD`: any registered or plug-in reward over HTTP (FastAPI + uvicorn).

The schema of POST /score and GET /health is in rewards/wire.py. The reward is built once, before
the server listens, and is only ever called from one worker thread (a reward need not be thread
safe); requests are read and decoded concurrently and wait for that thread in turn. A reward that
raises on a request is called again per sample, so one bad sample costs only its own score (null,
its error text in `errors`); a reward that returns the wrong number of scores is a 500 with that
message. No request can stop the server.

Requires the `serve` extra: pip install "mmrl[serve]".
"""

import asyncio
import concurrent.futures as cf
import hmac
import json
import logging
import socket
from typing import Callable

from rewards import wire
from rewards.scorer import RewardError, score_isolated

log = logging.getLogger("mmrl.rewards.server")


def _checked(values, n: int, name: str) -> list:
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise RewardError(f"reward {name!r} returned {got} scores for {n} samples; "
                          "a reward must return one float or None per sample")
    return [wire.score_value(v) for v in values]


def score_request(reward: Callable, samples: list, name: str) -> tuple[list, list]:
    """(scores, errors): failures isolated per sample as the trainer's scorer does (its error text for
    each null score); a RewardError (wrong number of scores) passes through."""
    scores, errors, _ = score_isolated(lambda batch: _checked(reward(batch), len(batch), name), samples)
    return scores, [None if e is None else f"{type(e).__name__}: {e}" for e in errors]


def create_app(reward: Callable, name: str, *, token: str | None = None,
               max_request_bytes: int = 64 * 2**20):
    """The FastAPI app serving `reward` (already built) under the label `name`."""
    fastapi = wire.require("fastapi", "mmrl rewards serve")
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response

    app = fastapi.FastAPI(title=f"mmrl reward {name}", docs_url=None, redoc_url=None, openapi_url=None)
    worker = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmrl-reward-server")
    HTTPException = fastapi.HTTPException

    def authorize(request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise HTTPException(401, "missing or wrong token: send the header 'Authorization: Bearer TOKEN'",
                                headers={"WWW-Authenticate": "Bearer"})

    async def read_capped(request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_request_bytes:
            raise HTTPException(413, _too_large(int(declared), max_request_bytes))
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_request_bytes:
                raise HTTPException(413, _too_large(len(body), max_request_bytes))
        return bytes(body)

    def decode(body: bytes) -> list:
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HTTPException(400, f"request body is not JSON: {e}") from None
        try:
            return wire.decode_request(payload)
        except wire.WireError as e:
            raise HTTPException(422, str(e)) from None

    @app.get("/health")
    def health(request: fastapi.Request):
        authorize(request)
        return {"status": "ok", "reward": name}

    @app.post("/score")
    async def score(request: fastapi.Request):
        authorize(request)
        samples = await run_in_threadpool(decode, await read_capped(request))
        try:
            scores, errors = await asyncio.wrap_future(worker.submit(score_request, reward, samples, name))
        except Exception as e:  # noqa: BLE001  (a broken reward is the client's news, not the server's end)
            log.error("reward %r failed on a request of %d samples: %s: %s", name, len(samples), type(e).__name__, e)
            raise HTTPException(500, f"reward {name!r}: {type(e).__name__}: {e}") from None
        body = json.dumps({"scores": scores, "errors": errors}, allow_nan=False)
        return Response(body, media_type="application/json")

    return app


def _too_large(size: int, limit: int) -> str:
    return (f"request body of {size} bytes is over the server's cap of {limit} bytes "
            f"(--max-request-mb); send fewer samples per request (the remote reward's batch_size)")


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one); OSError if it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def make_server(app, log_level: str = "info"):
    """A uvicorn server for `app`; run it with `.run(sockets=[listen(host, port)])`, stop it with
    `.should_exit = True`."""
    uvicorn = wire.require("uvicorn", "mmrl rewards serve")
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=False, timeout_graceful_shutdown=5))
