"""The running-trial keys on the real Redis: claimed while a trial runs, gone when it ends."""

from __future__ import annotations

import time

import redis

from trialq.heartbeat import RunningTrial, TrialBeacon, live_workers, running_trials


def _claim(pid: int = 42) -> RunningTrial:
    return RunningTrial("w1@host", "study", 3, 1, "task-1", pid, time.time())


def test_a_trial_is_claimed_while_it_runs_and_released_at_its_end(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    claim = _claim()
    beacon = TrialBeacon(client, claim, interval_s=5, ttl_s=20).start()
    assert running_trials(client) == [claim]
    assert 0 < client.pttl(claim.key) <= 20_000
    assert live_workers(client) == [], "a trial key is not a worker's heartbeat"
    beacon.stop()
    assert running_trials(client) == []


def test_a_worker_with_two_processes_claims_two_trials(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    beacons = [TrialBeacon(client, _claim(pid), 5, 20).start() for pid in (1, 2)]
    assert sorted(t.pid for t in running_trials(client)) == [1, 2]
    for beacon in beacons:
        beacon.stop()


def test_a_claim_no_one_renews_expires_with_its_ttl(redis_url: str) -> None:
    """What a SIGKILLed trial process leaves: a key that stops claiming within one TTL."""
    client = redis.Redis.from_url(redis_url)
    beacon = TrialBeacon(client, _claim(), interval_s=60, ttl_s=0.3).start()
    time.sleep(0.6)
    assert running_trials(client) == []
    beacon.stop()
