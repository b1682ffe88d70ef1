"""Per-queue running counts on the real Redis, read as KEDA's redis scaler reads a key: by its
type (ZCARD for a sorted set), so one class's trials never keep another class's workers up."""

from __future__ import annotations

import time

import redis

from trialq.wire.heartbeat import RunningTrial, TrialBeacon
from trialq.wire.keys import queue_running_key
from trialq.wire.queue_running import QueueClaim, running_on


def keda_reads(client: redis.Redis, key: str) -> int:
    """What KEDA's redis scaler (2.0 and later) reads of a key: its size, by its type."""
    kind = client.type(key).decode()
    sizes = {"zset": client.zcard, "set": client.scard, "hash": client.hlen}
    return int(sizes.get(kind, client.llen)(key))


def _renew(client: redis.Redis, claim: QueueClaim, ttl_ms: int, now_s: float | None = None) -> None:
    pipe = client.pipeline(transaction=False)
    claim.renew(pipe, ttl_ms, now_s)
    pipe.execute()


def test_each_queue_counts_only_its_own_workers_trials(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    for routing_key, task in (("gpu-l4", "a"), ("gpu-l4@1x16g", "b"), ("gpu-large", "c")):
        _renew(client, QueueClaim.for_delivery(routing_key, task), 20_000)
    assert keda_reads(client, queue_running_key("gpu-l4")) == 2  # a class queue is its base's
    assert keda_reads(client, queue_running_key("gpu-large")) == 1
    assert keda_reads(client, queue_running_key("gpu")) == 0
    QueueClaim("gpu-l4", "a").release(client)
    assert running_on(client, "gpu-l4") == 1 == keda_reads(client, queue_running_key("gpu-l4"))


def test_a_lapsed_claim_goes_at_the_next_renewal_on_its_queue(redis_url: str) -> None:
    """What a SIGKILLed trial process leaves: a claim nobody renews, gone at the next write."""
    client = redis.Redis.from_url(redis_url)
    dead, live = QueueClaim("gpu", "dead"), QueueClaim("gpu", "live")
    _renew(client, dead, 1_000, now_s=time.time() - 5)  # lapsed 4 s ago
    assert running_on(client, "gpu") == 0
    _renew(client, live, 20_000)
    assert keda_reads(client, queue_running_key("gpu")) == 1


def test_the_count_expires_where_no_trial_of_the_queue_runs_any_more(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    _renew(client, QueueClaim("gpu", "only"), 300)
    assert keda_reads(client, queue_running_key("gpu")) == 1
    time.sleep(0.5)
    assert keda_reads(client, queue_running_key("gpu")) == 0


def test_a_trial_beacon_holds_its_claim_while_the_trial_runs(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    trial = RunningTrial("w1@host", "study", 3, 1, "task-1", 42, time.time())
    claim = QueueClaim.for_delivery("gpu@1x16g", "task-1")
    beacon = TrialBeacon(client, trial, interval_s=0.05, ttl_s=20, claim=claim).start()
    assert keda_reads(client, queue_running_key("gpu")) == 1
    time.sleep(0.2)  # renewed, never counted twice
    assert keda_reads(client, queue_running_key("gpu")) == 1
    beacon.stop()
    assert keda_reads(client, queue_running_key("gpu")) == 0
