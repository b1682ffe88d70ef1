"""The Celery edge on the worker side: the app, its settings, and the `trialq.run_trial` task.

`celery -A trialq.worker worker` and `trialq worker` both start this app. The settings here
carry the design: one trial per process, one message reserved at a time, acknowledged only
after the trial ends, JSON only. The worker's parent may import TensorFlow (`preload`) but
never initialises it or a GPU: it checks that before every fork, and each child at its start.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from contextvars import Token
from typing import Any

import redis
from celery import signals
from celery.exceptions import Ignore, SoftTimeLimitExceeded, WorkerShutdown
from celery.worker import state as worker_state

from trialq import logs
from trialq._celery.app import RESULT_TTL_S, TASK_NAME, create_app
from trialq._celery.pool import claim_trial_slot
from trialq.errors import TrialqError
from trialq.lifeline import die_with_parent
from trialq.settings import Settings
from trialq.trial import checkpoints
from trialq.trial.device import TensorFlowDevice
from trialq.trial.prewarm import device_in_use, preload, preload_modules
from trialq.trial.runner import run_trial
from trialq.trial.telemetry import MIB, DeviceBaseline
from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.heartbeat import Heartbeat, RunningTrial, TrialBeacon, WorkerBeat
from trialq.wire.keys import DEFAULT_QUEUE, result_key, withdrawn_key
from trialq.wire.messages import Outcome, TrialRequest, TrialResult

EX_SOFTWARE = 70
"""Exit status of a worker, or a pool child, that refuses to go on (os.EX_SOFTWARE)."""

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the module moved

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
    task_id = self.request.id
    if _trial_redis().exists(withdrawn_key(task_id), result_key(task_id)):
        # Withdrawn by the driver, or a redelivery of a trial that already ended: not run.
        raise Ignore()
    claim_trial_slot()
    channel = ReportChannel(_trial_redis())
    root = settings.checkpoint_root or checkpoints.default_root()
    result = run_trial(
        request,
        channel=channel,
        device=TensorFlowDevice(),
        allowed_modules=settings.allowed_modules,
        timeout_errors=(SoftTimeLimitExceeded,),
        baseline=_baseline,
        checkpoint_root=root,
        artifact_root=settings.artifact_root,
    )
    message = _bounded_json(result)
    _keep_result(task_id, message)
    with contextlib.suppress(OSError, redis.RedisError):
        checkpoints.remove_orphans(channel, root)  # after the result: off the trial's time
    if result.device_refused:
        _stop_taking_trials()
    return json.loads(message)  # type: ignore[no-any-return]


def _stop_taking_trials() -> None:
    """Warm-shut the worker down: its device is not clean, so no trial should go to it.

    A container restart (compose's restart policy, Kubernetes) ends whatever process in it
    still holds the device, and the new worker measures a clean baseline.
    """
    logger.critical("device not back to its baseline; this worker stops taking trials")
    os.kill(os.getppid(), signal.SIGTERM)


def _keep_result(task_id: str, message: str) -> None:
    """Store the result under trialq's own key, waiting out a Redis restart if needed."""
    for delay in (0, 0.5, 1, 2, 4, 8, 15, 30, 30, 30):
        time.sleep(delay)
        try:
            _trial_redis().set(result_key(task_id), message, ex=RESULT_TTL_S)
            return
        except redis.RedisError:
            continue


def _bounded_json(result: TrialResult) -> str:
    """The result as JSON; one too large to store keeps the outcome's facts, not the metrics."""
    message = result.model_dump_json()
    if len(message) <= settings.max_result_bytes:
        return message
    refused = {
        "outcome": Outcome.ERROR,
        "metrics": {},
        "error": f"result of {len(message)} bytes refused (limit {settings.max_result_bytes})",
    }
    return result.model_copy(update=refused).model_dump_json()


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
    on the trial's time. It dies with the worker (`trialq.lifeline`): a trial whose worker is
    gone is retried elsewhere, and must not hold the GPU meanwhile.
    """
    die_with_parent(signal.SIGKILL)
    reason = device_in_use()
    if reason is not None:
        logger.critical("pool child %d exits unused: %s before the fork", os.getpid(), reason)
        os._exit(EX_SOFTWARE)
    with contextlib.suppress(redis.RedisError):
        _trial_redis().ping()
        if _trial_redis() is not app.backend.client:
            app.backend.client.ping()


_heartbeat: Heartbeat | None = None
_baseline: DeviceBaseline | None = None


@signals.worker_init.connect
def _measure_device_baseline(**_: Any) -> None:
    """Before the pool forks any trial process: the memory a clean device holds."""
    global _baseline
    tolerance = settings.gpu_baseline_tolerance_mb * MIB
    _baseline = DeviceBaseline.measure(TensorFlowDevice(), tolerance)


@signals.worker_ready.connect
def _freeze_started_worker(**_: Any) -> None:
    """Move what the worker built while starting out of the collector's sight.

    Celery collects garbage in the parent before every fork (its issue 2927), and with one
    process per trial that is before every trial: walking the consumer, the pool and the
    connections each time cost the parent 3 ms a trial. They live as long as the worker.
    """
    gc.collect()
    gc.freeze()


@signals.worker_ready.connect
def _start_heartbeat(sender: Any = None, **_: Any) -> None:
    global _heartbeat
    queues = tuple(sorted(sender.app.amqp.queues.consume_from or [DEFAULT_QUEUE]))
    beat = WorkerBeat(
        name=sender.hostname,
        host=socket.gethostname(),
        pid=os.getpid(),
        queues=queues,
        gpu=os.environ.get("CUDA_VISIBLE_DEVICES"),
        beat_at=0.0,
    )
    client = redis.Redis.from_url(settings.broker_url, socket_timeout=5)
    _heartbeat = Heartbeat(
        client,
        beat,
        settings.heartbeat_interval_s,
        settings.heartbeat_ttl_s,
        mark=settings.heartbeat_file,
    )
    _heartbeat.start()


@signals.after_setup_logger.connect
def _structured_logs(logger: logging.Logger, **_: Any) -> None:
    """Every worker line, Celery's too, names its study, trial and attempt (or `-`)."""
    logs.adopt_handlers(logger)


_beacon: TrialBeacon | None = None
_log_token: Token[Mapping[str, str]] | None = None


@signals.task_prerun.connect
def _claim_trial(sender: Any = None, task_id: str = "", args: Any = (), **_: Any) -> None:
    """In the trial process: tell `trialq status` which trial this worker now runs, and
    name it on every log line until the task ends (Celery's 'succeeded' line included)."""
    global _beacon, _log_token
    if getattr(sender, "name", None) == TASK_NAME:
        running = _running_trial(sender.request.hostname, task_id, args[0])
        _log_token = logs.enter_trial(running)
        interval, ttl = settings.heartbeat_interval_s, settings.heartbeat_ttl_s
        _beacon = TrialBeacon(_trial_redis(), running, interval, ttl).start()


def _running_trial(worker: str, task_id: str, payload: dict[str, Any]) -> RunningTrial:
    request = TrialRequest.model_validate(payload)
    return RunningTrial(
        worker=worker,
        study=request.study,
        number=request.number,
        attempt=request.attempt,
        task_id=task_id,
        pid=os.getpid(),
        started_at=time.time(),
    )


@signals.task_postrun.connect
def _release_trial(**_: Any) -> None:
    """The trial is over, whatever its outcome: this worker no longer runs it."""
    global _beacon, _log_token
    if _beacon is not None:
        _beacon.stop()
        _beacon = None
    if _log_token is not None:
        logs.leave_trial(_log_token)
        _log_token = None


@signals.worker_shutting_down.connect
def _preempt_running_trials(how: str = "", **_: Any) -> None:
    """SIGTERM (warm shutdown): tell each running trial to save and return, at once, and
    with `stop_grace_s` set, kill what still runs that much later, before the platform kills
    the whole worker.

    Celery's warm shutdown waits for the running task however long it takes; a spot node
    gives 30 s to 2 min. The notice is the attempt's stop flag in Redis, which
    `trial.should_stop()` reads; the driver finds it there too, so an attempt killed after it
    counts as preempted, not as a lost worker. Runs in the parent's signal handler: it only
    writes a few keys and starts a timer thread.
    """
    if how != "Warm":
        return  # a cold shutdown ends the trials at once; the driver sees them lost
    running = _running_requests()
    if not running:
        return
    try:
        client = redis.Redis.from_url(settings.broker_url, socket_timeout=5)
        channel = ReportChannel(client)
        for request, _pid in running:
            channel.request_stop(TrialAddress(request.study, request.number, request.attempt))
    except redis.RedisError as exc:
        logger.warning("stop notice not sent (Redis: %s); the trials run on until killed", exc)
    pids = [pid for _request, pid in running]
    grace = settings.stop_grace_s
    if grace is None:
        logger.warning("SIGTERM: %d running trial(s) told to stop", len(pids))
        return
    logger.warning(
        "SIGTERM: %d running trial(s) told to stop; killed in %g s if still running",
        len(pids), grace,
    )  # fmt: skip
    timer = threading.Timer(grace, _kill_trials, args=(pids, grace))
    timer.daemon = True
    timer.start()


def _running_requests() -> list[tuple[TrialRequest, int]]:
    """The trials this worker runs now, with the pid of each one's process."""
    running = []
    for request in list(worker_state.active_requests):
        pid = getattr(request, "worker_pid", None)
        if getattr(request, "name", None) != TASK_NAME or not pid:
            continue
        try:
            running.append((TrialRequest.model_validate(request.args[0]), int(pid)))
        except (ValueError, IndexError, TypeError):
            continue
    return running


def _kill_trials(pids: list[int], grace: float) -> None:
    """The grace is over: end what still runs, so the worker exits before it is killed."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            logger.warning("trial process %d killed %g s after its stop notice", pid, grace)


@signals.worker_shutdown.connect
def _stop_heartbeat(**_: Any) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()
