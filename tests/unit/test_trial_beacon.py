"""The running-trial keys on the real Redis: claimed while a trial runs, gone when it ends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from trialq.local import free_port
from trialq.wire.heartbeat import (
    AttemptBeacon,
    Heartbeat,
    RunningTrial,
    TrialBeacon,
    WorkerBeat,
    attempt_alive,
    live_workers,
    running_trials,
)


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


def test_a_worker_touches_its_heartbeat_file_only_when_the_beat_reached_redis(
    redis_url: str, tmp_path: Path
) -> None:
    mark = tmp_path / "heartbeat"
    beat = WorkerBeat(name="w@host", host="host", pid=1, queues=("gpu",), gpu=None, beat_at=0)
    beating = Heartbeat(redis.Redis.from_url(redis_url), beat, interval_s=60, ttl_s=5, mark=mark)
    beating.start()
    try:
        assert mark.exists(), "the first beat reached Redis: the health check sees it"
        mark.unlink()
        away = Heartbeat(
            redis.Redis(port=free_port(), socket_timeout=1), beat, interval_s=60, ttl_s=5, mark=mark
        )
        with pytest.raises(redis.ConnectionError):
            away.start()
        assert not mark.exists(), "a beat Redis never got must not look healthy"
    finally:
        beating.stop()


def test_an_attempt_lives_while_its_trial_process_beats(redis_url: str) -> None:
    """What the driver reads when the worker's own heartbeat is gone (issue 26.3)."""
    client = redis.Redis.from_url(redis_url)
    # A TTL a loaded host's scheduler cannot starve the beacon's thread past.
    beacon = TrialBeacon(client, _claim(), interval_s=0.05, ttl_s=2.0).start()
    assert attempt_alive(client, "task-1") and not attempt_alive(client, "task-2")
    time.sleep(2.5)  # past the TTL: renewed by the beacon's thread, not by the worker
    assert attempt_alive(client, "task-1")
    beacon.stop()
    assert not attempt_alive(client, "task-1")


def test_a_process_unwinding_without_a_word_leaves_its_attempt_to_the_ttl(redis_url: str) -> None:
    """A trial's `sys.exit` unwinds through Celery's postrun: deleting the attempt key then
    made the driver take the exit for a lost worker, and retry it, before the pool's word on
    the exit (`crashed: exitcode 0`) arrived (CI, test_trial_ends)."""
    client = redis.Redis.from_url(redis_url)
    beacon = TrialBeacon(client, _claim(), interval_s=60, ttl_s=1.0).start()
    beacon.stop(returned=False)
    assert running_trials(client) == [], "status no longer shows it running"
    assert attempt_alive(client, "task-1"), "the driver still takes it for alive"
    time.sleep(1.2)
    assert not attempt_alive(client, "task-1")


def test_an_attempt_key_names_its_log_file_and_reads_back_as_older_values_did(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    logged = TrialBeacon(client, _claim(), 60, 20, log_file="logs/s/trial-3-attempt-1.log")
    logged.start()
    assert AttemptBeacon.read(client.get("trialq:attempt:task-1")) == AttemptBeacon(
        42, "logs/s/trial-3-attempt-1.log"
    )
    logged.stop()
    bare = TrialBeacon(client, _claim(), 60, 20).start()
    raw = client.get("trialq:attempt:task-1")
    assert raw == b"42", "without a log, the bare pid older drivers wrote"
    assert AttemptBeacon.read(raw) == AttemptBeacon(42)
    bare.stop()
    assert AttemptBeacon.read(b"not json") is None and AttemptBeacon.read(None) is None
