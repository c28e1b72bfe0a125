"""The `remote` reward (rewards/builtin/remote.py) against real scripted HTTP servers: config checks,
retries, timeouts, 4xx, dead servers, partial failures, and the scorer's isolation around it."""

import threading

import pytest

from rewards.builtin.remote import RemoteRewardError
from rewards.registry import resolve
from rewards.sample import Sample
from rewards.scorer import RewardError, RewardSet, RewardSpec
from rewards.wire import require

SAMPLES = [Sample("p", f"out {i}", id=f"s{i}") for i in range(6)]


def _remote(url: str, **kw):
    return resolve("remote", {"url": url, "backoff_s": 0.01, **kw})


@pytest.mark.parametrize("kw, message", [
    ({}, "config key 'url' must look like http://host:port, got ''"),
    ({"url": "localhost:8000"}, "config key 'url' must look like"),
    ({"url": "ftp://h:1"}, "config key 'url' must look like"),
    ({"url": "http://h:1", "batch_size": 0}, "config key 'batch_size' must be an integer >= 1, got 0"),
    ({"url": "http://h:1", "max_concurrency": True}, "config key 'max_concurrency' must be an integer >= 1"),
    ({"url": "http://h:1", "retries": -1}, "config key 'retries' must be an integer >= 0"),
    ({"url": "http://h:1", "request_timeout_s": 0}, "config key 'request_timeout_s' must be a number > 0"),
    ({"url": "http://h:1", "backoff_s": "1"}, "config key 'backoff_s' must be a number > 0"),
])
def test_config_errors_name_the_key(kw, message):
    with pytest.raises(ValueError, match="remote reward: ") as err:
        resolve("remote", kw)
    assert message in str(err.value)


def test_a_missing_optional_dependency_names_the_extra():
    with pytest.raises(ImportError, match=r"'serve' extra: pip install \"mmrl\[serve\]\""):
        require("mmrl_no_such_module", "the 'remote' reward")


def test_5xx_is_retried_until_it_succeeds(make_script, scripted, ones):
    script = make_script(lambda n, s: (503, {"detail": "warming up"}) if n <= 2 else ones(n, s))
    with scripted(script) as url:
        assert _remote(url, retries=2)(SAMPLES[:2]) == [1.0, 1.0]
    assert len(script.posts) == 3


def test_4xx_is_not_retried_and_names_the_url(make_script, scripted):
    script = make_script(lambda n, s: (422, {"detail": "samples[0].meta: expected dict"}))
    with scripted(script) as url:
        with pytest.raises(RemoteRewardError, match=f"{url}/score refused the request.*422.*samples\\[0\\].meta"):
            _remote(url, retries=3)(SAMPLES[:1])
    assert len(script.posts) == 1


def test_a_slow_server_times_out_and_each_attempt_is_counted(make_script, ones, scripted):
    script = make_script(ones, sleep=threading.Event())
    with scripted(script) as url:
        with pytest.raises(RemoteRewardError, match=f"{url}/score failed after 2 attempts.*Timeout"):
            _remote(url, retries=1, request_timeout_s=0.2)(SAMPLES[:1])
    assert len(script.posts) == 2


def test_a_dead_server_is_an_error_naming_the_url_at_build_and_at_call(scripted, make_script, ones):
    with scripted(make_script(ones)) as url:
        reward = _remote(url, retries=0, backoff_s=30.0)      # no waits; a 30 s fail-fast cycle
    with pytest.raises(RemoteRewardError, match=f"{url}/score failed after 1 attempts.*ConnectError"):
        reward(SAMPLES)
    with pytest.raises(RemoteRewardError, match=f"{url}/score failed.*no new attempt within 30 s"):
        reward(SAMPLES[:1])                       # within one backoff cycle: no new attempts
    with pytest.raises(ValueError, match=f"config key 'url': reward server {url}/health failed after 1 attempts"):
        _remote(url, retries=0)


def test_batches_go_out_concurrently_in_order_and_a_failing_one_scores_none(caplog, make_script, scripted):
    def answer(n, samples):
        if any(s["id"] == "s3" for s in samples):
            return 500, {"detail": "reward 'x': CUDA out of memory"}
        return 200, {"scores": [float(s["id"][1:]) for s in samples]}

    script = make_script(answer)
    with scripted(script) as url:
        reward = _remote(url, batch_size=2, max_concurrency=2, retries=0, backoff_s=30.0)
        assert reward(SAMPLES) == [0.0, 1.0, None, None, 4.0, 5.0]
        assert reward(SAMPLES[:2]) == [0.0, 1.0]          # one failed batch is not a dead server
    assert sorted(len(p) for p in script.posts) == [2, 2, 2, 2]
    assert script.max_in_flight <= 2
    assert f"{url}/score failed after 1 attempts (HTTP 500: reward 'x': CUDA out of memory)" in caplog.text


def test_scores_that_are_all_errors_raise_with_the_servers_error_text(make_script, scripted):
    script = make_script(lambda n, s: (200, {"scores": [None] * len(s), "errors": ["KeyError: 'color'"] * len(s)}))
    with scripted(script) as url:
        with pytest.raises(RemoteRewardError, match=f"{url}: the reward raised: KeyError: 'color'"):
            _remote(url)(SAMPLES[:2])
        bad = make_script(lambda n, s: (200, {"scores": [1.0]}))
    with scripted(bad) as url:
        with pytest.raises(RemoteRewardError, match=r"off the schema: scores: expected a list of 2"):
            _remote(url, retries=0)(SAMPLES[:2])


def test_an_unsendable_sample_fails_alone_under_the_scorer(serving):
    odd = Sample("p", "x", meta={"f": object()}, id="odd")
    with serving(lambda s: [1.0] * len(s), "ones") as url:
        rs = RewardSet([RewardSpec("remote", "r", kwargs={"url": url, "backoff_s": 0.01})])
        scores, metrics = rs.score(SAMPLES[:3] + [odd])
    assert scores[:, 0].tolist()[:3] == [1.0, 1.0, 1.0] and metrics["reward/r/failed"] == 1


def test_under_the_scorer_a_killed_server_counts_failures_then_stops_naming_the_url(scripted, ones, make_script):
    def answer(n, samples):
        return (503, {"detail": "gone"}) if any(s["id"] == "s5" for s in samples) else ones(n, samples)

    with scripted(make_script(answer)) as url:
        spec = RewardSpec("remote", "r", max_fail_frac=0.5,
                          kwargs={"url": url, "batch_size": 2, "retries": 1, "backoff_s": 0.01})
        rs = RewardSet([spec])
        _, metrics = rs.score(SAMPLES)            # one batch of three fails: 2 of 6 unscorable, go on
        assert metrics["reward/r/failed"] == 2
    with pytest.raises(RewardError, match=f"failed on 6 of 6 samples.*first error: RemoteRewardError: "
                                          f"reward server {url}/score failed after 2 attempts"):
        rs.score(SAMPLES)
