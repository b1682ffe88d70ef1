"""A worker told to stop (SIGTERM, Celery's warm shutdown): each running trial is told to save
and return at once, and with `TRIALQ_STOP_GRACE_S` set, killed if it still runs that much
later, before the platform kills the whole worker (docs/preemption.md).

Celery's warm shutdown waits for the running task however long it takes; a spot node gives
30 s to 2 min. The notice is the attempt's stop flag in Redis, which `trial.should_stop()`
reads; the driver finds it there too, so an attempt killed after it counts as preempted, not
as a lost worker. It runs in the parent's signal handler: it only writes a few keys and
starts a timer thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Sequence

import redis

from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.messages import TrialRequest

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the code moved


def preempt(
    broker_url: str,
    running: Sequence[tuple[TrialRequest, int]],
    grace: float | None,
    key_ttl_s: int,
) -> None:
    """Tell each running trial (its request, its process) to stop; kill it `grace` later."""
    if not running:
        return
    send_stop_notices(broker_url, [request for request, _pid in running], key_ttl_s)
    kill_later([pid for _request, pid in running], grace)


def send_stop_notices(broker_url: str, requests: Sequence[TrialRequest], key_ttl_s: int) -> None:
    """Set each attempt's stop flag; a Redis that refuses leaves them running until killed."""
    try:
        client = redis.Redis.from_url(broker_url, socket_timeout=5)
        channel = ReportChannel(client, key_ttl_s)
        for request in requests:
            channel.request_stop(TrialAddress.of(request))
    except redis.RedisError as exc:
        logger.warning("stop notice not sent (Redis: %s); the trials run on until killed", exc)


def kill_later(pids: Sequence[int], grace: float | None) -> None:
    """With a grace set, kill the trials' processes that much later, from a timer thread."""
    if grace is None:
        logger.warning("SIGTERM: %d running trial(s) told to stop", len(pids))
        return
    logger.warning(
        "SIGTERM: %d running trial(s) told to stop; killed in %g s if still running",
        len(pids), grace,
    )  # fmt: skip
    timer = threading.Timer(grace, _kill_trials, args=(list(pids), grace))
    timer.daemon = True
    timer.start()


def _kill_trials(pids: list[int], grace: float) -> None:
    """The grace is over: end what still runs, so the worker exits before it is killed."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            logger.warning("trial process %d killed %g s after its stop notice", pid, grace)
