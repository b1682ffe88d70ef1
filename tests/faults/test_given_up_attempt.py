"""An attempt the driver gave up on is ended (issue 26, item 3): a worker host frozen past
the heartbeat's TTL (its parent and its trial process SIGSTOPped: a partition, as the driver
sees it), then back. The driver re-sends the trial and marks the first attempt killed; the
first attempt's own process reads the mark at its next beacon renewal and ends its process
group while its parent is still frozen (Celery's revoke cannot reach it through the parent).

Before, the driver only withdrew the lost task, and the first attempt ran on to its end once
the host was back, holding its GPU beside the re-sent one.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable

import psutil
import pytest
import redis
from waiting import wait_until

from faults.harness import FAST_HEARTBEAT, DriverRun, assert_clean, fault_spec, grid
from trialq.local import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def test_an_attempt_given_up_on_ends_though_its_worker_parent_is_frozen(
    run: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    cluster = start_workers(2, extra_env=FAST_HEARTBEAT)  # beacons renewed every 0.5 s
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 12.0), 1, max_retries=1))
    driver = run.start()
    client = redis.Redis.from_url(cluster.broker_url)
    task_id, trial = wait_until(lambda: _started(client), 60, "the first attempt to start")
    parent = trial.parent()
    assert parent is not None
    for process in (parent, trial):  # the whole host, as the driver sees it
        os.kill(process.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: _started(client, besides=task_id), 30, "the trial re-sent and started")
        os.kill(trial.pid, signal.SIGCONT)  # its parent stays frozen
        thawed_at = time.monotonic()
        wait_until(lambda: not _running(trial), 10, "the given-up attempt's process to end")
        ended_after = time.monotonic() - thawed_at
    finally:
        os.kill(parent.pid, signal.SIGCONT)
    _, err = driver.communicate(timeout=120)
    verdict = run.judge("attempt given up on (host frozen past its TTL, back)", 1)
    assert_clean(verdict)
    (told,) = run.study().trials
    assert told.state.name == "COMPLETE", (told.user_attrs, err[-2000:])
    assert told.user_attrs["attempts"] == 2 and told.values == [2.0], told.user_attrs
    assert ended_after < 3, ended_after


def _started(client: redis.Redis, besides: str = "") -> tuple[str, psutil.Process] | None:
    """The task id and the process of an attempt Celery says STARTED, other than `besides`."""
    for key in client.scan_iter(match="celery-task-meta-*"):
        meta = json.loads(client.get(key) or b"{}")
        if meta.get("status") == "STARTED" and meta["task_id"] != besides:
            return meta["task_id"], psutil.Process(int(meta["result"]["pid"]))
    return None


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
