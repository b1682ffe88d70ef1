"""Waiting in tests: poll a condition until it holds or a deadline passes, never a fixed
sleep that a slow or busy machine outruns."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import redis

T = TypeVar("T")


class WaitedTooLong(AssertionError):
    """A condition a test waited for did not come true in time (a test failure)."""


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str | Callable[[], str],
    interval_s: float = 0.05,
) -> T:
    """Call `predicate` until it returns something truthy, and return that; after `timeout_s`
    fail naming `what` (a callable is asked then, to describe the state it gave up in)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            raise WaitedTooLong(f"waited {timeout_s:g} s for {described}")
        time.sleep(interval_s)


def redis_answers(client: redis.Redis) -> bool:
    """Whether the server answers PING; a server still starting (refusing or loading) does not."""
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.BusyLoadingError):
        return False


def wait_for_redis(client: redis.Redis, timeout_s: float = 20) -> redis.Redis:
    """Wait until a Redis server the test started answers; return its client."""
    wait_until(lambda: redis_answers(client), timeout_s, f"Redis to answer ({client})")
    return client
