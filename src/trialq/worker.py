"""The Celery edge on the worker side: the app, its settings, and the `trialq.run_trial` task.

`celery -A trialq.worker worker` and `trialq worker` both start this app. The settings here
carry the design: one trial per process, one message reserved at a time, acknowledged only
after the trial ends, JSON only. The worker's parent never touches TensorFlow or a GPU.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis
from celery import signals
from celery.exceptions import Ignore, SoftTimeLimitExceeded

from trialq.celery_app import RESULT_TTL_S, TASK_NAME, create_app, result_key, withdrawn_key
from trialq.channel import ReportChannel
from trialq.device import TensorFlowDevice
from trialq.heartbeat import Heartbeat, WorkerBeat
from trialq.messages import Outcome, TrialRequest, TrialResult
from trialq.runner import run_trial
from trialq.settings import Settings

settings = Settings()
app = create_app(settings)
_redis: redis.Redis | None = None


def _trial_redis() -> redis.Redis:
    """The trial process's own Redis connection (created after the fork, never inherited)."""
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(settings.broker_url)
    return _redis


@app.task(name=TASK_NAME, bind=True, acks_late=True)
def run_trial_task(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Run one trial attempt in this (fresh) process and return its `TrialResult` as JSON."""
    request = TrialRequest.model_validate(payload)
    task_id = self.request.id
    if _trial_redis().exists(withdrawn_key(task_id), result_key(task_id)):
        # Withdrawn by the driver, or a redelivery of a trial that already ended: not run.
        raise Ignore()
    result = run_trial(
        request,
        channel=ReportChannel(_trial_redis()),
        device=TensorFlowDevice(),
        allowed_modules=settings.allowed_modules,
        timeout_errors=(SoftTimeLimitExceeded,),
    )
    message = _bounded(result).model_dump_json()
    _keep_result(task_id, message)
    return json.loads(message)  # type: ignore[no-any-return]


def _keep_result(task_id: str, message: str) -> None:
    """Store the result under trialq's own key, waiting out a Redis restart if needed."""
    for delay in (0, 0.5, 1, 2, 4, 8, 15, 30, 30, 30):
        time.sleep(delay)
        try:
            _trial_redis().set(result_key(task_id), message, ex=RESULT_TTL_S)
            return
        except redis.RedisError:
            continue


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
