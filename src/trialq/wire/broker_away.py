"""Which of Redis's errors mean the broker cannot serve for now, rather than a bug.

Lost or slow, or up but refusing writes it will take again once its operator acts: full at
`maxmemory` under `noeviction` (the policy compose and k8s ship), a replica made read-only by
a failover, snapshots failing (`MISCONF`), a dataset still loading. The driver rides each out
as an outage, with its limit and its one line (`driver/outage.py`); a full Redis ended it with
a traceback and exit 4 (issue 38, row 2).
"""

from __future__ import annotations

import redis
import redis.exceptions

_AWAY = (
    redis.ConnectionError,  # BusyLoadingError too: the dataset still loading
    redis.TimeoutError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.MasterDownError,
    redis.exceptions.TryAgainError,
)
_AWAY_REPLIES = ("MISCONF", "LOADING", "MASTERDOWN", "TRYAGAIN", "OOM", "READONLY")
"""Replies redis-py leaves as a plain `ResponseError` (or, in older versions, all of them)."""


def broker_away(exc: BaseException) -> bool:
    """Whether `exc`, an error of redis-py's, says the broker cannot serve for now."""
    if isinstance(exc, _AWAY):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).startswith(_AWAY_REPLIES)
