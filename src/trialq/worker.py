"""The Celery edge on the worker side: the app, its settings, and the `trialq.run_trial` task.

`celery -A trialq.worker worker` and `trialq worker` both start this app. The settings here
carry the design: one trial per process, one message reserved at a time, acknowledged only
after the trial ends, JSON only. The worker's parent may import TensorFlow (`preload`) but
never initialises it or a GPU: it checks that before every fork, and each child at its start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from typing import Any

import redis
from celery import signals
from celery.exceptions import SoftTimeLimitExceeded, WorkerShutdown

from trialq.celery_app import TASK_NAME, create_app, withdrawn_key
from trialq.channel import ReportChannel
from trialq.device import TensorFlowDevice
from trialq.errors import TrialqError
from trialq.heartbeat import Heartbeat, WorkerBeat
from trialq.messages import Outcome, TrialRequest, TrialResult
from trialq.pool import claim_trial_slot
from trialq.prewarm import device_in_use, preload, preload_modules
from trialq.runner import run_trial
from trialq.settings import Settings

EX_SOFTWARE = 70
"""Exit status of a worker, or a pool child, that refuses to go on (os.EX_SOFTWARE)."""

logger = logging.getLogger(__name__)

settings = Settings()
app = create_app(settings)
_redis: redis.Redis | None = None


def _trial_redis() -> redis.Redis:
    """The trial process's Redis (connected after the fork, never inherited): the result
    backend's client when the backend is the broker, so that a trial opens one connection."""
    global _redis
    if _redis is None:
        if settings.backend_url == settings.broker_url:
            _redis = app.backend.client
        else:
            _redis = redis.Redis.from_url(settings.broker_url)
    return _redis


@app.task(name=TASK_NAME, bind=True, acks_late=True)
def run_trial_task(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Run one trial attempt in this (fresh) process and return its `TrialResult` as JSON."""
    request = TrialRequest.model_validate(payload)
    if _trial_redis().exists(withdrawn_key(self.request.id)):
        return _withdrawn(request).model_dump(mode="json")
    claim_trial_slot()
    result = run_trial(
        request,
        channel=ReportChannel(_trial_redis()),
        device=TensorFlowDevice(),
        allowed_modules=settings.allowed_modules,
        timeout_errors=(SoftTimeLimitExceeded,),
    )
    return _bounded(result).model_dump(mode="json")


def _withdrawn(request: TrialRequest) -> TrialResult:
    """The answer for a task the driver took back before it started: nothing was run."""
    return TrialResult(
        study=request.study,
        number=request.number,
        attempt=request.attempt,
        outcome=Outcome.ERROR,
        error="withdrawn by the driver before it started; not run",
    )


def _bounded(result: TrialResult) -> TrialResult:
    """Refuse a result too large to store: keep the outcome's facts, drop the metrics."""
    size = len(result.model_dump_json())
    if size <= settings.max_result_bytes:
        return result
    return result.model_copy(
        update={
            "outcome": Outcome.ERROR,
            "metrics": {},
            "error": f"result of {size} bytes refused (limit {settings.max_result_bytes})",
        }
    )


@signals.worker_init.connect
def _preload(**_: Any) -> None:
    """Import the framework in the parent, before the pool forks (`trialq worker` did already)."""
    try:
        preload(preload_modules(settings.preload))
    except TrialqError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None


@signals.worker_before_create_process.connect
def _refuse_fork_after_device_use(**_: Any) -> None:
    """The parent is about to fork a trial process: never with a device initialised."""
    reason = device_in_use()
    if reason is not None:
        logger.critical("worker stops: %s in its parent; no trial process is forked", reason)
        raise WorkerShutdown(EX_SOFTWARE)


@signals.worker_process_init.connect
def _prepare_trial_process(**_: Any) -> None:
    """A new child, before it takes a trial: refuse inherited device state, then connect.

    A spare child waits idle for its trial, so it opens its Redis connections now rather than
    on the trial's time.
    """
    reason = device_in_use()
    if reason is not None:
        logger.critical("pool child %d exits unused: %s before the fork", os.getpid(), reason)
        os._exit(EX_SOFTWARE)
    with contextlib.suppress(redis.RedisError):
        _trial_redis().ping()
        if _trial_redis() is not app.backend.client:
            app.backend.client.ping()


_heartbeat: Heartbeat | None = None


@signals.worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    global _heartbeat
    queues = tuple(sorted(sender.app.amqp.queues.consume_from or ["gpu"]))
    beat = WorkerBeat(
        name=sender.hostname,
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=queues,
        gpu=os.environ.get("CUDA_VISIBLE_DEVICES"),
        beat_at=0.0,
    )
    client = redis.Redis.from_url(settings.broker_url, socket_timeout=5)
    _heartbeat = Heartbeat(client, beat, settings.heartbeat_interval_s, settings.heartbeat_ttl_s)
    _heartbeat.start()


@signals.worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()
