"""A message of an attempt already told, handed out again, is not run again (docs/
reliability.md). kombu hands out again what a worker reserved and never acknowledged (a
worker lost after its trial's result was stored), after the visibility timeout: the driver,
as it lets go of a told attempt's result, marks withdrawn each one whose message kombu still
holds reserved, and a worker checks for the mark before it runs anything. Before, the whole
trial ran again, its told value kept, its GPU time spent twice.

The lost worker's reservation is a stand-in (a fake: a worker lost in the instant between
storing its result and acknowledging cannot be hit reliably): the test writes the reservation
into kombu's `unacked` hash as kombu does, and restores it as kombu does after the visibility
timeout. The driver, Redis and the worker that takes the message again are real.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from waiting import wait_until

from faults.harness import DriverRun, assert_clean, fault_spec, grid
from trialq.local import LocalCluster
from trialq.wire.keys import KOMBU_UNACKED, kombu_queue_key

pytestmark = [pytest.mark.faults, pytest.mark.integration]

QUEUE = "gpu"


def test_a_told_attempts_message_redelivered_is_not_run_again(
    run: DriverRun, start_workers: Callable[..., LocalCluster], redis_url: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    runs_log = tmp_path / "runs.log"
    spec = fault_spec("records_its_process", grid("log", str(runs_log)), 1)
    run.write_spec(spec.replace('pruner = "none"', 'pruner = "none"\nmetric = "pid"'))
    driver = run.start()
    message = wait_until(lambda: client.lindex(kombu_queue_key(QUEUE), 0), 60, "it queued")
    task_id = str(json.loads(message)["headers"]["id"])
    lost_tag = "a-lost-workers-delivery-tag"
    client.hset(KOMBU_UNACKED, lost_tag, json.dumps([json.loads(message), "", QUEUE]))
    start_workers(1, queue=QUEUE)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err[-2000:]
    assert len(runs_log.read_text().split()) == 1

    client.hdel(KOMBU_UNACKED, lost_tag)  # handed out again, as kombu restores it
    client.rpush(kombu_queue_key(QUEUE), message)
    worker_log = tmp_path / "workers-0" / "worker0.log"
    received = f"Task trialq.run_trial[{task_id}] received"
    wait_until(lambda: worker_log.read_text().count(received) == 2 and _acknowledged(client), 60,
               "the worker to take the message again and be done with it")  # fmt: skip

    assert len(runs_log.read_text().split()) == 1, "the told trial ran again"
    assert_clean(run.judge("a told attempt's message redelivered", 1))
    (told,) = run.study().trials
    assert told.state.name == "COMPLETE"


def _acknowledged(client: redis.Redis) -> bool:
    """Whether no message waits or is reserved (acknowledged late: once its task ended)."""
    return client.llen(kombu_queue_key(QUEUE)) == 0 and client.hlen(KOMBU_UNACKED) == 0
