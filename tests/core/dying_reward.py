"""A reward for tests/core/test_async.py, loaded by path (`tests/core/dying_reward.py:match_or_die`): the bandit's
`match`, except that a rollout worker SIGKILLs its own process on its `die_on_call`-th call, once per run (a
marker file records the death, so the worker Ray restarts lives)."""

import os
import signal

from mmrl.testing.bandit import match

_calls = 0


def match_or_die(samples: list, *, marker: str, driver_pid: int, die_on_call: int) -> list:
    global _calls
    _calls += 1
    if os.getpid() != driver_pid and _calls == die_on_call and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return match(samples)
