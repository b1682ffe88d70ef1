"""Two workers beating under one name hide each other's loss (issue 38, row 6): each says so,
once; a worker restarted under its name, over its dead predecessor's key, says nothing."""

from __future__ import annotations

import json
import time

import redis
from waiting import wait_until

from trialq.wire.heartbeat import Heartbeat, WorkerBeat, twin_beating
from trialq.wire.keys import worker_key


def _beat(pid: int) -> WorkerBeat:
    return WorkerBeat(name="twin@host", host="host", pid=pid, queues=("gpu",), gpu=None, beat_at=0)


def test_two_workers_under_one_name_each_say_so_once(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    first = Heartbeat(client, _beat(101), interval_s=0.05, ttl_s=5)
    second = Heartbeat(client, _beat(202), interval_s=0.05, ttl_s=5)
    first.start()
    second.start()
    try:
        wait_until(lambda: first.twin and second.twin, 10, "both workers to see the other")
        assert first.twin == "host host, pid 202" and second.twin == "host host, pid 101"
    finally:
        first.stop()
        second.stop()


def test_a_worker_restarted_over_its_dead_predecessors_key_says_nothing(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    stale = _beat(101).heartbeat_json() | {"beat_at": time.time()}
    client.set(worker_key("twin@host"), json.dumps(stale), px=5000)  # killed, key not expired
    restarted = Heartbeat(client, _beat(303), interval_s=0.05, ttl_s=5)
    restarted.start()
    try:
        time.sleep(0.5)  # ten beats
        assert restarted.twin is None
    finally:
        restarted.stop()


def test_a_live_twin_is_found_by_its_renewed_beat_and_a_dead_one_is_not(redis_url: str) -> None:
    """What `trialq worker --hostname` asks before it starts (`twin_beating`): a key that
    changes within the wait is a live worker's; one that stays is a dead one's."""
    client = redis.Redis.from_url(redis_url)
    live = Heartbeat(client, _beat(101), interval_s=0.05, ttl_s=5)
    assert twin_beating(client, "twin@host", 1.0, poll_s=0.01) is None, "no key: no twin"
    live.start()
    try:
        found = twin_beating(client, "twin@host", 2.0, me=("host", 303), poll_s=0.01)
        assert found is not None and (found.host, found.pid) == ("host", 101)
    finally:
        live.stop()
    dead = json.dumps(_beat(101).heartbeat_json())
    client.set(worker_key("twin@host"), dead, px=60_000)
    started = time.monotonic()
    assert twin_beating(client, "twin@host", 0.3, me=("host", 303), poll_s=0.01) is None
    assert time.monotonic() - started < 5
