"""Celery's Redis result backend, riding out a Redis that refuses writes it will take again.

A Redis full at `maxmemory` under `noeviction` (the policy compose and k8s ship), a replica
made read-only by a failover, `MISCONF` or `LOADING` refuse a write without a lost
connection, so Celery's backend did not retry it: a trial process storing `STARTED` into a
full Redis failed outside its task's body, and the worker's parent, storing that failure,
took the refusal in its pool callback for an unrecoverable error and exited. The trial's
message waited for a worker that was gone, and the driver, which had written nothing in the
meantime, saw no outage: it waited forever (1 run in 5 here). Such a
refusal is retried now as a lost connection is (`result_backend_always_retry`, up to
`result_backend_max_retries`, backing off to 10 s): the store goes in once Redis takes
writes again.
"""

from __future__ import annotations

from celery.backends.redis import RedisBackend

from trialq.wire.broker_away import broker_away


class AwayTolerantRedisBackend(RedisBackend):  # type: ignore[misc]
    """`RedisBackend` that also retries the replies of a Redis away for a while
    (`trialq.wire.broker_away`)."""

    def exception_safe_to_retry(self, exc: BaseException) -> bool:
        return bool(super().exception_safe_to_retry(exc)) or broker_away(exc)


def backend_for(url: str) -> str:
    """The `result_backend` setting for `url`: this backend for a Redis URL, else the URL."""
    if url.partition("://")[0] in ("redis", "rediss"):
        return f"{__name__}:{AwayTolerantRedisBackend.__name__}+{url}"
    return url
