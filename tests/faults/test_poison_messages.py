"""A malformed entry on the queue's Redis list is set aside, and the worker lives on: its
running trial completes, and it takes the next trial (issue 26, item 2)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis
from celery import Celery
from trial_requests import trial_request
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.wire.dispatch import TaskPhase
from trialq.wire.keys import poison_key

pytestmark = [pytest.mark.faults, pytest.mark.integration]

POISON = [
    b"not json",
    b"\xff\xfe not utf-8",
    b"[1, 2, 3]",
    b'"a string"',
    b'{"body": "x"}',
    json.dumps({"body": "x", "properties": {"delivery_tag": "t", "delivery_info": 7}}).encode(),
    json.dumps(  # kombu's shape, Celery's headers, but no task of this version: Celery's to drop
        {
            "body": "bm90IGEgdGFzaw==",
            "content-type": "application/json",
            "content-encoding": "utf-8",
            "headers": {"task": "trialq.run_trial", "id": "v9"},
            "properties": {
                "delivery_tag": "t-v9",
                "body_encoding": "base64",
                "delivery_info": {"exchange": "", "routing_key": "gpu"},
            },
        }
    ).encode(),
]


def _finished(dispatcher: CeleryDispatcher, task_id: str) -> bool:
    return dispatcher.statuses([task_id])[task_id].phase is TaskPhase.FINISHED


def test_malformed_queue_entries_are_set_aside_and_the_worker_runs_on(
    redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    cluster = start_workers(1)
    (worker,) = cluster._workers
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    client = redis.Redis.from_url(redis_url)
    running = dispatcher.submit(
        trial_request(entrypoint="trials:sleeps", params={"sleep_s": 3.0}), "gpu"
    )
    wait_until(
        lambda: dispatcher.statuses([running])[running].phase is TaskPhase.RUNNING, 60, "start"
    )
    for entry in POISON:
        client.lpush("gpu", entry)
    wait_until(lambda: client.llen("gpu") == 0, 30, "the worker to pop every entry")

    wait_until(lambda: _finished(dispatcher, running), 60, "the running trial to finish")
    assert dispatcher.statuses([running])[running].result.outcome == "ok"  # type: ignore[union-attr]
    sender = Celery("stranger", broker=redis_url)  # a task of another shape, or version
    sender.send_task("trialq.run_trial", args=[{"version": 99, "study": []}], queue="gpu")
    after = dispatcher.submit(trial_request(), "gpu")
    wait_until(lambda: _finished(dispatcher, after), 60, "the next trial, on the same worker")
    assert worker.poll() is None, "the worker exited"
    aside = client.lrange(poison_key("gpu"), 0, -1)
    assert len(aside) == len(POISON) - 1, aside  # the last one is Celery's to drop
    assert {b"not json", b'"a string"', b"[1, 2, 3]"} <= set(aside), aside
    log = (cluster.log_dir / "worker0.log").read_text()
    assert "Unrecoverable error" not in log, log[-3000:]


def test_the_driver_reads_past_malformed_queue_entries(redis_url: str) -> None:
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    task_id = dispatcher.submit(trial_request(), "gpu")
    client = redis.Redis.from_url(redis_url)
    for entry in POISON:
        client.lpush("gpu", entry)
    assert dispatcher.pending_ids("gpu") == {task_id, "v9"}  # v9: an id, though no task
    dispatcher.withdraw([task_id], "gpu")
    assert client.llen("gpu") == len(POISON)
