"""Which of Redis's errors mean the broker cannot serve for now, rather than a bug.

Lost or slow, or up but refusing writes it will take again once its operator acts: full at
`maxmemory` under `noeviction` (the policy compose and k8s ship), a replica made read-only by
a failover, snapshots failing (`MISCONF`), a dataset still loading. The driver rides each out
as an outage, with its limit and its one line (`driver/outage.py`); a full Redis ended it with
a traceback and exit 4.
"""

from __future__ import annotations

import re

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
_AWAY_REPLIES = frozenset({"MISCONF", "LOADING", "MASTERDOWN", "TRYAGAIN", "OOM", "READONLY"})
"""Replies redis-py leaves as a plain `ResponseError` (or, in older versions, all of them)."""
_IN_A_PIPELINE = re.compile(r"Command # \d+ \(.*\) of pipeline caused error: ", re.DOTALL)
"""What redis-py puts before a reply met inside a pipeline (the command that met it)."""


def broker_away(exc: BaseException) -> bool:
    """Whether `exc`, an error of redis-py's, says the broker cannot serve for now: by the
    code Redis replied with, wherever redis-py put it (a MISCONF met inside a pipeline came
    after the pipeline's prefix, and ended the driver where a lone command's was an outage)."""
    if isinstance(exc, _AWAY):
        return True
    return isinstance(exc, redis.ResponseError) and reply_code(exc) in _AWAY_REPLIES


def reply_code(exc: redis.ResponseError) -> str:
    """The code Redis's error reply began with (`MISCONF`, `ERR`, ...)."""
    text = str(exc)
    within = _IN_A_PIPELINE.match(text)
    return text[within.end() if within else 0 :].split(" ", 1)[0]
