"""A worker's parent frozen past its heartbeat's TTL while its trial process runs on: the
attempt lives by the trial process's own beacon, and its result is used (issue 26, item 3).

Before, the driver took the frozen parent's expired heartbeat for a lost worker: with
`max_retries = 0` a trial that finished `ok` was stored FAIL `worker_lost`; with retries it
ran twice.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest
import redis
from waiting import wait_until

from faults.harness import (
    FAST_HEARTBEAT,
    DriverRun,
    assert_clean,
    fault_spec,
    grid,
    worker_parent_running_a_trial,
)
from trialq.local import LocalCluster
from trialq.wire.keys import RESULT_PREFIX, WORKER_PREFIX

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def test_a_frozen_worker_parent_does_not_lose_its_running_trial(
    run: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    cluster = start_workers(1, extra_env=FAST_HEARTBEAT)  # its heartbeat expires in 3 s
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 6.0), 1, max_retries=0))
    driver = run.start()
    parent = worker_parent_running_a_trial(cluster)
    client = redis.Redis.from_url(run.broker_url)
    os.kill(parent.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: not any(client.scan_iter(match=WORKER_PREFIX + "*")), 10,
                   "the frozen worker's heartbeat to expire")  # fmt: skip
        frozen_at = time.monotonic()

        # The key lives until the driver tells the trial and forgets it: a driver quicker
        # than this poll has ended by then, the trial told.
        def stored_or_told() -> bool:
            return any(client.scan_iter(match=RESULT_PREFIX + "*")) or driver.poll() is not None

        wait_until(stored_or_told, 60, "the trial process to store its result")
        _, err = driver.communicate(timeout=60)
        told_after = time.monotonic() - frozen_at
    finally:
        os.kill(parent.pid, signal.SIGCONT)
    verdict = run.judge("worker parent frozen past its TTL", 1)
    assert_clean(verdict)
    (trial,) = run.study().trials
    assert trial.state.name == "COMPLETE", (trial.user_attrs, err[-2000:])
    assert trial.user_attrs["outcome"] == "ok" and trial.user_attrs["attempts"] == 1
    assert trial.values == [1.0]  # `sleeps` returns its attempt: it ran once
    assert told_after < 30, told_after
