"""The `remote` reward: a reward served by `mmrl rewards serve` (rewards/server.py), over HTTP.

    rewards:
      - {name: remote, url: "http://127.0.0.1:8000", label: clip}    # the other keys have defaults

A step's samples go out in requests of `batch_size`, up to `max_concurrency` at a time; a request
that meets a connection error, a timeout (`request_timeout_s`) or a 5xx is sent again after
`backoff_s`, 2 * backoff_s, ... (`retries` times); a 4xx is not retried. When some requests of a
call still fail, their samples score None (unscorable, counted) and a warning names the URL; when
all fail, the call raises an error naming the URL, which the scorer (rewards/scorer.py) isolates
per sample and, past `max_fail_frac`, puts in the RewardError that stops training. After a call
found the server unreachable (every request failed through every retry), calls fail at once (no new
attempts) for one backoff cycle, so the scorer's per-sample retries of a dead server cost
milliseconds, not minutes.

`timeout_s`, `weight`, `label` and `max_fail_frac` are the scorer's keys, as for any reward
(`timeout_s` bounds the whole call); `token` defaults to the environment variable MMRL_REWARD_TOKEN.
Building the reward checks the config and asks the server's /health, so a wrong URL or token is a
configuration error (exit 2) before any model is built. Requires the `serve` extra (httpx).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from rewards import wire
from rewards.registry import register

log = logging.getLogger("mmrl.rewards.remote")


class RemoteRewardError(RuntimeError):
    """A request to the reward server failed for good; the message names the URL. `unreachable`:
    it failed on connection errors, timeouts or 5xx through every retry."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class RemoteConfig:
    url: str                          # http(s)://host:port of `mmrl rewards serve`
    request_timeout_s: float = 60.0   # per HTTP request
    retries: int = 3                  # further attempts after a connection error, timeout or 5xx
    backoff_s: float = 0.5            # wait before the first retry; doubles each retry
    max_concurrency: int = 4          # requests in flight at once
    batch_size: int = 32              # samples per request
    token: str | None = None          # sent as 'Authorization: Bearer TOKEN'


def validate(cfg: RemoteConfig) -> RemoteConfig:
    """The config with a normalised url; a ValueError names the key and what is expected."""
    parts = urlsplit(str(cfg.url or ""))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"remote reward: config key 'url' must look like http://host:port, got {cfg.url!r}")
    for key, integral, low in (("request_timeout_s", False, 0), ("backoff_s", False, 0), ("retries", True, 0),
                               ("max_concurrency", True, 1), ("batch_size", True, 1)):
        value = getattr(cfg, key)
        kind, bound = ("an integer", f">= {low}") if integral else ("a number", f"> {low}")
        if (isinstance(value, bool) or not isinstance(value, int if integral else (int, float))
                or (value < low if integral else value <= low)):
            raise ValueError(f"remote reward: config key {key!r} must be {kind} {bound}, got {value!r}")
    return dataclasses.replace(cfg, url=str(cfg.url).rstrip("/"))


class RemoteReward:
    """`reward(samples) -> list[float | None]` answered by a reward server."""

    def __init__(self, cfg: RemoteConfig):
        httpx = wire.require("httpx", "the 'remote' reward")
        logging.getLogger("httpx").setLevel(logging.WARNING)     # not one INFO line per request
        self.cfg, self._httpx = cfg, httpx
        headers = {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}
        self._client = httpx.Client(headers=headers, timeout=cfg.request_timeout_s,
                                    limits=httpx.Limits(max_connections=cfg.max_concurrency))
        self._pool = cf.ThreadPoolExecutor(max_workers=cfg.max_concurrency, thread_name_prefix="mmrl-remote")
        self._down: tuple[float, str] | None = None     # (monotonic time until which to fail fast, why)

    def health(self) -> str:
        """The name of the reward the server serves; a RemoteRewardError if it does not answer."""
        payload = self._request("GET", "/health", None)
        return str(payload.get("reward", "?")) if isinstance(payload, dict) else "?"

    def __call__(self, samples: list) -> list:
        if not samples:
            return []
        down = self._down
        if down is not None and time.monotonic() < down[0]:
            raise RemoteRewardError(f"{down[1]} (no new attempt within {self._cycle_s():g} s of that failure)")
        size = self.cfg.batch_size
        batches = [samples[i:i + size] for i in range(0, len(samples), size)]
        futures = [self._pool.submit(self._score_batch, b) for b in batches]
        scores, failed = [], []
        for batch, future in zip(batches, futures):
            try:
                scores += future.result()
            except (RemoteRewardError, wire.WireError) as e:
                failed.append(e)
                scores += [None] * len(batch)
        if failed and len(failed) == len(batches):
            if all(getattr(e, "unreachable", False) for e in failed):
                self._down = (time.monotonic() + self._cycle_s(), str(failed[0]))
            raise failed[0]
        if failed:
            log.warning("remote reward: %d of %d requests failed, their samples are unscorable; first: %s",
                        len(failed), len(batches), failed[0])
        return scores

    def _score_batch(self, batch: list) -> list:
        payload = self._request("POST", "/score", wire.encode_request(batch))
        try:
            scores, errors = wire.decode_scores(payload, len(batch))
        except wire.WireError as e:
            raise RemoteRewardError(f"reward server {self.cfg.url}/score answered off the schema: {e}") from None
        first = next((e for e in errors if e is not None), None)
        if first is not None and all(v is None for v in scores):
            raise RemoteRewardError(f"reward server {self.cfg.url}: the reward raised: {first}")
        return scores

    def _request(self, method: str, path: str, body: bytes | None):
        """One request with retries; the parsed JSON answer, or a RemoteRewardError naming the URL."""
        url, why = self.cfg.url + path, ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                time.sleep(self.cfg.backoff_s * 2 ** (attempt - 1))
            try:
                r = self._client.request(method, url, content=body,
                                         headers={"Content-Type": "application/json"} if body else None)
            except self._httpx.TransportError as e:       # refused, reset, timed out
                why = f"{type(e).__name__}: {e}"
                continue
            if r.status_code < 400:
                try:
                    return r.json()
                except ValueError as e:
                    raise RemoteRewardError(f"reward server {url} answered {r.status_code} with no JSON: {e}") from None
            why = f"HTTP {r.status_code}: {_detail(r)}"
            if r.status_code < 500:
                raise RemoteRewardError(f"reward server {url} refused the request ({why})")
        raise RemoteRewardError(f"reward server {url} failed after {self.cfg.retries + 1} attempts ({why})",
                                unreachable=True)

    def _cycle_s(self) -> float:
        return self.cfg.backoff_s * (2 ** self.cfg.retries - 1 if self.cfg.retries else 1)


def _detail(r) -> str:
    try:
        payload = r.json()
    except ValueError:
        return r.text[:300]
    return str(payload.get("detail", payload) if isinstance(payload, dict) else payload)[:300]


@register("remote", factory=True)
def remote(url: str = "", request_timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
           max_concurrency: int = 4, batch_size: int = 32, token: str | None = None) -> RemoteReward:
    """A reward served by `mmrl rewards serve` at `url` (batched, concurrent, retried on 5xx / lost connections)."""
    cfg = validate(RemoteConfig(url, request_timeout_s, retries, backoff_s, max_concurrency, batch_size,
                                token or os.environ.get("MMRL_REWARD_TOKEN") or None))
    reward = RemoteReward(cfg)
    try:
        served = reward.health()
    except RemoteRewardError as e:
        raise ValueError(f"remote reward: config key 'url': {e}; is `mmrl rewards serve NAME --port N` "
                         f"running there (with the same token)?") from None
    log.info("remote reward: %s serves %r", cfg.url, served)
    return reward


def _check(url: str = "", token: str | None = None, **numbers) -> None:
    """The config checks (url, numbers) without asking the server: run when the config is loaded."""
    validate(RemoteConfig(url, **numbers))


remote.mmrl_validate = _check
