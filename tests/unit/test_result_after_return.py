"""A trial that returned is told as it returned, whatever the broker did while its result
waited (issue 38, row 4): the store goes on past its schedule while Redis is away, until the
trial's hard limit, and the soft time limit arriving meanwhile changes nothing."""

from __future__ import annotations

import time

import pytest
import redis
from trial_requests import trial_request

from trialq.wire.keys import result_key
from trialq.worker.child import _despite
from trialq.worker.result_store import ResultStore

REQUEST = trial_request(study="digits", number=7)


class AwayRedis:
    """A stand-in Redis client (no server can be made to refuse on cue here) that raises
    `error` at the first `failures` writes."""

    def __init__(self, failures: int, error: redis.RedisError) -> None:
        self.failures, self.error = failures, error
        self.stored: dict[str, str] = {}

    def set(self, key: str, value: str, ex: int) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        self.stored[key] = value

    def publish(self, channel: str, message: str) -> None:
        pass


def _store(client: AwayRedis) -> ResultStore:
    store = ResultStore(lambda: client, key_ttl_s=60, max_result_bytes=1000)  # type: ignore[arg-type, return-value]
    store.retry_delays_s = (0.0, 0.01)
    return store


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("Connection refused"),
        redis.TimeoutError("Timeout reading from socket"),
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
    ],
)
def test_a_result_waits_for_redis_past_the_schedule_while_it_is_away(
    error: redis.RedisError,
) -> None:
    client = AwayRedis(failures=20, error=error)
    _store(client).keep(REQUEST, "task-1", '{"outcome": "ok"}', time.monotonic() + 30)
    assert client.stored == {result_key("task-1"): '{"outcome": "ok"}'}


def test_a_refusal_that_is_no_outage_ends_the_tries_at_the_schedule() -> None:
    client = AwayRedis(failures=20, error=redis.ResponseError("WRONGTYPE"))
    _store(client).keep(REQUEST, "task-1", '{"outcome": "ok"}', time.monotonic() + 30)
    assert client.stored == {} and client.failures == 18


def test_no_try_past_the_hard_limit() -> None:
    client = AwayRedis(failures=10**6, error=redis.ConnectionError("Connection refused"))
    started = time.monotonic()
    _store(client).keep(REQUEST, "task-1", '{"outcome": "ok"}', started + 0.2)
    assert client.stored == {} and time.monotonic() - started < 2


class SoftLimit(Exception):
    """Stands for Celery's SoftTimeLimitExceeded (no Celery in the trial wing's tests)."""


def test_the_soft_limit_arriving_after_the_trial_returned_changes_nothing() -> None:
    calls: list[int] = []

    def keep() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise SoftLimit()

    _despite((SoftLimit,), keep)
    assert len(calls) == 2, "the result was not stored after the soft limit interrupted it"
