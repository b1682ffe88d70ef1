"""A worker host lost between claiming a trial and Celery's `STARTED` (issue 26).

A trial process writes its beacon in `task_prerun`, a moment before Celery stores `STARTED`.
A host lost in that moment leaves the task's meta absent and its message reserved in kombu's
`unacked` hash until the visibility timeout (12 h): before, the driver saw a task still
waiting and waited that long. Now a beacon seen once and gone marks the attempt lost: it is
re-sent as a new attempt, the old one marked withdrawn, so the message kombu hands out again
after the visibility timeout is not run a second time.

The lost host is a stand-in (a fake: the instant is too short to hit by cutting a real host
reliably): the test takes the message off the queue into `unacked` as kombu does when a
worker reserves it, writes the trial's beacon with a short life and lets it expire. The
driver, Redis, the worker that runs the re-sent trial and kombu's own redelivery are real.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from waiting import wait_until

from faults.harness import DriverRun, assert_clean, fault_spec, grid
from trialq.local import LocalCluster
from trialq.wire.keys import KOMBU_UNACKED, attempt_key, kombu_queue_key, withdrawn_key

pytestmark = [pytest.mark.faults, pytest.mark.integration]

QUEUE = "gpu"
BEACON_MS = 20000
"""Past the driver's 5 s between lost checks, stretched as they are on a loaded host (a check
waits ten times its own length after a slow one), so one check sees the beacon (as it sees a
real trial's, whose beacon lives a heartbeat TTL), then a later one finds it gone."""


def test_a_trial_whose_host_is_lost_before_its_start_is_stored_is_sent_again(
    run: DriverRun, start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    run.write_spec(fault_spec("one_argument", grid("x", 3), 1, max_retries=1))
    driver = run.start()
    message = wait_until(lambda: client.lpop(kombu_queue_key(QUEUE)), 60, "the trial queued")
    lost_id = _claim_and_vanish(client, message)

    try:
        wait_until(lambda: client.exists(withdrawn_key(lost_id)), 90, "the lost attempt given up")
    except BaseException:
        driver.kill()
        raise
    start_workers(1, queue=QUEUE)
    _, err = driver.communicate(timeout=120)

    assert driver.returncode == 0, err[-2000:]
    assert_clean(run.judge("host lost between the claim and STARTED", 1))
    (told,) = run.study().trials
    assert told.state.name == "COMPLETE" and told.values == [30.0], told.user_attrs
    assert told.user_attrs["attempts"] == 2, told.user_attrs
    assert client.get(f"celery-task-meta-{lost_id}") is None  # the lost attempt never ran

    # kombu hands the reserved message out again after the visibility timeout: refused.
    restored = json.loads(client.hget(KOMBU_UNACKED, _tag(message)) or b"null")
    assert restored is not None
    client.rpush(kombu_queue_key(QUEUE), json.dumps(restored[0]))
    wait_until(lambda: client.llen(kombu_queue_key(QUEUE)) == 0, 30, "the old message taken")
    assert run.judge("the lost attempt's message redelivered", 1).told_twice == 0
    assert len(run.study().trials) == 1


def _claim_and_vanish(client: redis.Redis, message: bytes) -> str:
    """What a worker host does up to `task_prerun` and no further: reserve the message
    (kombu's `unacked` hash) and write the trial's beacon, which then expires unrenewed."""
    task_id = str(json.loads(message)["headers"]["id"])
    client.hset(KOMBU_UNACKED, _tag(message), json.dumps([json.loads(message), "", QUEUE]))
    client.set(attempt_key(task_id), 4242, px=BEACON_MS)
    return task_id


def _tag(message: bytes) -> str:
    return str(json.loads(message)["properties"]["delivery_tag"])
