"""Where a trial process leaves its result: trialq's own Redis key, then a word on the study's
results channel, riding out a Redis restart (docs/reliability.md).

It runs in the trial's own process, after the trial (or, for the GPU memory guard's `oom`,
just before the process is killed), so it knows nothing of Celery: the Celery task returns
the same JSON as Celery's own result.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import redis

from trialq.wire.broker_away import broker_away
from trialq.wire.keys import result_key, results_channel
from trialq.wire.messages import TrialRequest, TrialResult
from trialq.wire.signing import Seal

RESULT_RETRY_DELAYS_S = (0, 0.5, 1, 2, 4, 8, 15, 30, 30, 30)
"""Waits before each try to store a trial's result: a Redis restart is ridden out for 2 min."""

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the code moved


class ResultStore:
    """A trial's result in Redis for `key_ttl_s`, at most `max_result_bytes` of JSON.

    `client` gives the trial process's Redis client (connected after the fork, never
    inherited), asked at each write. With a `seal` (the deployment's result secret) every
    result is signed for its task id, so that the driver can tell it from a forged one.
    """

    retry_delays_s: tuple[float, ...] = RESULT_RETRY_DELAYS_S

    def __init__(
        self,
        client: Callable[[], redis.Redis],
        key_ttl_s: int,
        max_result_bytes: int,
        seal: Seal | None = None,
    ) -> None:
        self.client = client
        self.key_ttl_s = key_ttl_s
        self.max_result_bytes = max_result_bytes
        self.seal = seal

    def keep(
        self, request: TrialRequest, task_id: str, message: str, away_until: float = 0.0
    ) -> bool:
        """Store the result under trialq's own key, waiting out a Redis restart if needed,
        then announce it on the study's results channel: a driver waiting wakes at once.

        While Redis is away (`wire/broker_away.py`) it goes on trying past `retry_delays_s`
        until `away_until` (`time.monotonic()`; the trial's hard limit ends the process about
        then anyway): a trial that returned is told as it returned, however long the broker
        was frozen within the driver's outage limit (it gave up after 2 min,
        and the trial was told what Celery made of the wait). False: not stored (Celery's
        own result is then the only one)."""
        error: redis.RedisError | None = None
        tries, started = 0, time.monotonic()
        schedule = iter(self.retry_delays_s)
        while True:
            delay = next(schedule, None)
            if delay is None:  # past the schedule: on only while Redis is away, in time
                delay = self.retry_delays_s[-1] if self.retry_delays_s else 1.0
                if error is None or not broker_away(error) or time.monotonic() > away_until:
                    break
            time.sleep(delay)
            tries += 1
            try:
                self.client().set(result_key(task_id), message, ex=self.key_ttl_s)
                self._announce(request, task_id)
                return True
            except redis.RedisError as exc:
                error = exc
        logger.error(
            "result of trial %d of study %r (attempt %d, task %s) not stored: Redis refused "
            "%d tries over %.1f s, last with: %s",
            request.number, request.study, request.attempt, task_id,
            tries, time.monotonic() - started, error,
        )  # fmt: skip
        return False

    def keep_now(self, task_id: str, result: TrialResult) -> None:
        """Store the result once, without waiting (the process is about to be killed)."""
        message = self._signed(task_id, result.model_dump_json())
        with contextlib.suppress(redis.RedisError):
            self.client().set(result_key(task_id), message, ex=self.key_ttl_s)

    def _announce(self, request: TrialRequest, task_id: str) -> None:
        """Publish the stored result's task id (best effort: a driver that misses it finds
        the result at its next pass anyway)."""
        with contextlib.suppress(redis.RedisError):
            self.client().publish(results_channel(request.study), task_id)

    def bounded_json(self, task_id: str, result: TrialResult) -> str:
        """The result as JSON, signed for `task_id` where there is a secret; one too large to
        store keeps the outcome's facts, not the metrics (the limit is the unsigned JSON's:
        a signature adds under 100 bytes)."""
        message = result.model_dump_json()
        limit = self.max_result_bytes
        if len(message) > limit:
            refused = f"result of {len(message)} bytes refused (limit {limit})"
            message = result.unstorable(refused).model_dump_json()
        return self._signed(task_id, message)

    def _signed(self, task_id: str, message: str) -> str:
        return message if self.seal is None else self.seal.signed(task_id, message)
