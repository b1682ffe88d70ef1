"""Interrupting the driver charges no trial that never ran (issue 26, item 10).

Ctrl-C or SIGTERM with trials queued withdraws them (revoked, taken off the queue). On the
re-run they come back revoked, or not at all: either way they are sent again under their own
number, using no retry, so with `max_retries = 0` none of them fails.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

import pytest
import redis
from waiting import wait_until

from faults.harness import FAST_HEARTBEAT, DriverRun, assert_clean, fault_spec, grid
from trialq.local import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.integration]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_trials_withdrawn_by_an_interrupt_are_sent_again_without_a_retry(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    start_workers: Callable[..., LocalCluster],
    stop: signal.Signals,
) -> None:
    run = DriverRun(tmp_path_factory.mktemp("interrupted"), redis_url)
    start_workers(1, extra_env=FAST_HEARTBEAT)
    body = fault_spec("sleeps", grid("sleep_s", 1.0, 1.1, 1.2, 1.3), 4, max_retries=0)
    run.write_spec(body.replace("max_in_flight = 2", "max_in_flight = 4"))
    driver = run.start("--json")
    wait_until(lambda: _sent(run) == 4 and _started(redis_url), 120, "4 sent, one started")
    driver.send_signal(stop)
    out, err = driver.communicate(timeout=60)
    assert driver.returncode == 130, err
    left = sum(t.state.name == "RUNNING" for t in run.study().trials)
    assert json.loads(out)["left_in_flight"] == left == 4, "the summary miscounts what it left"

    code, err = run.run()

    assert code == 0, err
    assert_clean(run.judge(f"driver interrupted ({stop.name}) with trials queued", 4))
    trials = run.study().trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4, [t.user_attrs for t in trials]
    assert all(t.user_attrs["retries"] == 0 for t in trials)


def _sent(run: DriverRun) -> int:
    try:
        return sum(t.user_attrs.get("task_id") is not None for t in run.study().trials)
    except KeyError:
        return 0


def _started(redis_url: str) -> bool:
    client = redis.Redis.from_url(redis_url)
    metas = (client.get(key) for key in client.scan_iter(match="celery-task-meta-*"))
    return any(json.loads(meta or b"{}").get("status") == "STARTED" for meta in metas)
