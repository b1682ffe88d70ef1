"""A trialq worker's life inside Celery's worker: one bootstep, each start beside its stop.

The worker's app carries the worker it runs (`TrialqWorker`, read with `worker_of(app)`):
its parent's state (`trialq.worker.WorkerState`, which knows nothing of Celery) and, in each
trial process, that process's steps (`WorkerChild`). What Celery runs reads it from there:
the bootstep below, the pool (`trialq._celery.pool`) and the task. In the order a worker
lives it, each start beside its stop:

| moment                                  | called by                 | start / stop              |
|-----------------------------------------|---------------------------|---------------------------|
| the worker built, before its pool forks | `WorkerLifecycle.create`  | `prepare`; fork guard and |
|                                         |                           | trial-process handlers on |
| the pool starts / has stopped           | `TrialPool.on_start/stop` | `open_slots/close_slots`  |
| consuming (once) / the pool has stopped | `.start` / `.shutdown`    | heartbeat and preemption  |
|                                         |                           | handler on / off          |

The step is on the consumer's blueprint because only there does Celery call a step after the
pool has stopped (`shutdown`, from the worker's `on_stopped`): a warm shutdown waits for the
running trials, and the worker beats until they have ended. A lost broker connection stops
and restarts the consumer's steps (`stop`, `start`): the heartbeat beats through it.

Celery's signals are one set per process; the step connects its handlers when its moment
starts and disconnects them when it ends, so a process with no trialq worker runs none of
them (the log lines' handler aside: `trialq._celery.worker`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable
from typing import Any

import redis
from celery import bootsteps, signals, states
from celery.exceptions import WorkerShutdown
from celery.utils.dispatch import Signal
from celery.worker import state as worker_state

from trialq._celery.app import TASK_NAME
from trialq.wire.keys import DEFAULT_QUEUE
from trialq.wire.messages import TrialRequest
from trialq.worker.child import EX_SOFTWARE, WorkerChild
from trialq.worker.prewarm import device_in_use
from trialq.worker.state import WorkerState

logger = logging.getLogger("trialq.worker")  # the name log lines show

WORKER_ATTRIBUTE = "trialq_worker"
"""The attribute of a worker's Celery app that carries its `TrialqWorker`."""


class TrialqWorker:
    """The trialq worker a Celery app runs: its parent's state, and a trial process's steps.

    A trial process is forked with its own copy of the app and of this object, so the steps
    built here after the fork (`child`) are that process's alone: the one place a value lives
    per process.
    """

    def __init__(self, state: WorkerState, backend: Callable[[], redis.Redis]) -> None:
        self.state = state
        self._backend = backend
        self.trial_process: WorkerChild | None = None
        """In a trial process: its steps, once built; None in the parent."""

    def child(self) -> WorkerChild:
        """This trial process's steps (built at its start, or now: `celery worker -P solo`)."""
        if self.trial_process is None:
            self.trial_process = self.state.child(self._backend)
        return self.trial_process


def worker_of(app: Any) -> TrialqWorker | None:
    """The trialq worker `app` runs; None for an app that runs none (a test's pool)."""
    worker = getattr(app, WORKER_ATTRIBUTE, None)
    return worker if isinstance(worker, TrialqWorker) else None


class WorkerLifecycle(bootsteps.StartStopStep):  # type: ignore[misc]
    """The worker's parent through Celery's worker's life (the module's table, in order)."""

    label = "trialq"
    requires = ("celery.worker.consumer.tasks:Tasks",)  # started once it consumes

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        worker = worker_of(consumer.app)
        assert worker is not None, "added to the blueprint only by build_worker_app"
        self.worker = worker
        self.running = False
        self.beating = False
        self._forking: list[tuple[Signal, Callable[..., None]]] = [
            (signals.worker_before_create_process, self._before_fork),
            (signals.worker_process_init, self._trial_process_started),
            (signals.task_prerun, self._trial_claimed),
            (signals.task_postrun, self._trial_ended),
        ]
        self._running: list[tuple[Signal, Callable[..., None]]] = [
            (signals.worker_shutting_down, self._shutting_down),
        ]

    def create(self, consumer: Any) -> None:
        """The worker built, before its pool forks: prepare the state, then watch each fork
        (the handlers every trial process inherits)."""
        self.worker.state.concurrency = int(consumer.controller.concurrency or 1)
        self.worker.state.prepare()
        _connect(self._forking)

    def start(self, consumer: Any) -> None:
        """Consuming: freeze what starting built, beat, and preempt trials on SIGTERM. Once:
        a consumer restarted after a lost connection is the same worker."""
        if self.running:
            return
        _freeze_started_worker()
        queues = tuple(sorted(consumer.app.amqp.queues.consume_from or [DEFAULT_QUEUE]))
        concurrency = consumer.pool.num_processes if consumer.pool is not None else 1
        try:
            self.worker.state.start_heartbeat(consumer.hostname, queues, concurrency)
            self.beating = True
        except Exception:  # as when a signal started it: logged, and the worker runs on
            logger.exception("the worker's heartbeat did not start")
        settings = self.worker.state.settings
        logger.info("%s", code_line(settings.accept_code, settings.seal is not None))
        _connect(self._running)
        self.running = True

    def stop(self, consumer: Any) -> None:
        """The consumer stops for a lost connection (or before `shutdown`): the worker lives on."""

    def shutdown(self, consumer: Any) -> None:
        """The pool has stopped, its trials ended: stop beating, then forget the handlers."""
        if self.running:
            _disconnect(self._running)
            self.running = False
        if self.beating:
            self.worker.state.stop_heartbeat()
            self.beating = False
        _disconnect(self._forking)

    # In the parent.

    def _before_fork(self, **_: Any) -> None:
        _refuse_fork_after_device_use()

    def _shutting_down(self, how: str = "", **_: Any) -> None:
        """A cold shutdown ends the trials at once (the driver sees them lost); a warm one
        (SIGTERM) tells them to stop first."""
        if how == "Warm":
            self.worker.state.preempt(_running_requests())

    # In each trial process (handlers inherited through the fork).

    def _trial_process_started(self, **_: Any) -> None:
        self.worker.child().prepare()

    def _trial_claimed(
        self, sender: Any = None, task_id: str = "", args: Any = (), **_: Any
    ) -> None:
        if getattr(sender, "name", None) == TASK_NAME:
            delivered_on = (sender.request.delivery_info or {}).get("routing_key")
            self.worker.child().claim(sender.request.hostname, task_id, args[0], delivered_on)

    def _trial_ended(
        self, sender: Any = None, task_id: str = "", state: str | None = None, **_: Any
    ) -> None:
        child = self.worker.trial_process
        if child is None:
            return
        # Celery sends postrun from a `finally`: a trial's `sys.exit` passes here too, with no
        # state, its process ending without a word of its own.
        child.release(returned=state is not None)
        ours = getattr(sender, "name", None) == TASK_NAME
        if ours and state == states.SUCCESS and child.stored_result_of == task_id:
            _forget_success_meta(sender, task_id)


def _forget_success_meta(task: Any, task_id: str) -> None:
    """Drop the SUCCESS meta Celery has just stored where the trial stored its result under
    trialq's own key first (`trialq.worker.result_store`), which is what the driver
    reads, and forgets once the tell is written (`Dispatcher.forget_results`). Celery stores
    the meta after the trial's own result, often after the driver forgot that task, where it
    would stay for the key TTL. Redis away: the TTL removes it."""
    with contextlib.suppress(Exception):
        task.backend.forget(task_id)


def _connect(handlers: list[tuple[Signal, Callable[..., None]]]) -> None:
    for signal, handler in handlers:
        signal.connect(handler, weak=False)


def _disconnect(handlers: list[tuple[Signal, Callable[..., None]]]) -> None:
    for signal, handler in handlers:
        signal.disconnect(handler)


def _refuse_fork_after_device_use() -> None:
    """The parent is about to fork a trial process: never with a device initialised."""
    reason = device_in_use()
    if reason is not None:
        logger.critical("worker stops: %s in its parent; no trial process is forked", reason)
        raise WorkerShutdown(EX_SOFTWARE)


def _freeze_started_worker() -> None:
    """Move what the worker built while starting out of the collector's sight.

    Celery collects garbage in the parent before every fork (its issue 2927), and with one
    process per trial that is before every trial: walking the consumer, the pool and the
    connections each time cost the parent 3 ms a trial. They live as long as the worker.
    """
    gc.collect()
    gc.freeze()


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


def code_line(accepts: bool, has_secret: bool) -> str:
    """The ready message's line on trial functions carried as code (`wire/carried_code.py`)."""
    if not accepts:
        return "trial functions carried as code: refused (TRIALQ_ACCEPT_CODE=1 accepts signed ones)"
    if not has_secret:
        return "trial functions carried as code: refused, no secret to check them with"
    return "trial functions carried as code: accepted when signed with this cluster's secret"
