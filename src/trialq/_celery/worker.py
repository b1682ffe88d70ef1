"""The Celery edge on the worker side: the worker's app, its task, a bootstep and the signal
handlers, each only calling the worker's steps (`trialq.worker.WorkerState` in the parent,
`trialq.worker.child.WorkerChild` in each trial process).

`trialq worker` builds the app from the settings it was given (`build_worker_app`);
`celery -A trialq.worker worker` builds it on first use from the environment's
(`app_from_environment`). The settings in `trialq._celery.app` carry the design: one trial
per process, one message reserved at a time, acknowledged only after the trial ends, JSON
only. The worker's parent may import TensorFlow (`preload`) but never initialises it or a
GPU: it checks that before every fork, and each child at its start.

One worker runs per process, so the state it runs is this module's (`room`), set when its
app is built; each trial process builds its `WorkerChild` from it after the fork. Celery's
signals reach them through one handler per signal, each calling their steps in the order it
states, so nothing depends on the order Celery connects handlers in.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from typing import Any

from celery import Celery, bootsteps, signals, states
from celery.exceptions import Ignore, SecurityWarning, SoftTimeLimitExceeded, WorkerShutdown
from celery.worker import state as worker_state

from trialq import logs
from trialq._celery.app import TASK_NAME, create_app
from trialq._celery.remote_control import LimitedRemoteControl
from trialq.settings import Settings, redacted_url
from trialq.wire.keys import DEFAULT_QUEUE
from trialq.wire.messages import TrialRequest
from trialq.worker.child import EX_SOFTWARE, WorkerChild
from trialq.worker.prewarm import device_in_use
from trialq.worker.state import WorkerState

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the module moved

_room: WorkerState | None = None
"""The worker this process runs: set when its app is built, inherited by its trial processes."""

_child: WorkerChild | None = None
"""In a trial process: its steps, built from `_room` after the fork."""

_app: Celery | None = None
"""The app `_room` runs under, whose result backend a trial process may share."""


def current_room() -> WorkerState | None:
    """The worker this process runs; None where no worker app was built (a test's pool)."""
    return _room


def room() -> WorkerState:
    """The worker this process runs (its app was built)."""
    if _room is None:
        raise RuntimeError("no trialq worker app was built in this process")
    return _room


def child() -> WorkerChild:
    """This trial process's steps (built at its start, or now: `celery worker -P solo`)."""
    global _child
    if _child is None:
        _child = room().child(_backend_client)
    return _child


def build_worker_app(state: WorkerState) -> Celery:
    """The Celery app that runs `state`'s worker: its task, its bootstep, its log filter."""
    global _room, _child, _app
    app = create_app(state.settings)
    app.task(name=TASK_NAME, bind=True, acks_late=True, shared=False)(_run_trial_task)
    app.steps["worker"].add(WorkerStateStep)
    app.steps["consumer"].add(LimitedRemoteControl)
    _broker_named_plainly(state.settings.broker_url)
    _quiet_about_root(app.conf.accept_content)
    _room, _child, _app = state, None, app
    return app


def _quiet_about_root(accept_content: Any) -> None:
    """Celery warns at every start of a worker run as root (`platforms.check_privileges`),
    which is how a container runs by default: its danger is a pickled message running code
    as root, and it refuses to start as root with pickle unless `C_FORCE_ROOT` says so. A
    trialq worker accepts JSON only (`celery_config`), so the warning says nothing it could
    act on; with pickle accepted it stays."""
    if any("pickle" in str(kind) for kind in accept_content or ()):
        return
    warnings.filterwarnings(
        "ignore", message="You're running the worker with superuser privileges",
        category=SecurityWarning,
    )  # fmt: skip


def app_from_environment() -> Celery:
    """The app `celery -A trialq.worker worker` runs: the one this process built already
    (`trialq worker`), else one built now, its settings read from the environment once, here,
    when Celery first asks for it (never at an import)."""
    return _app if _app is not None else build_worker_app(WorkerState(Settings()))


def _run_trial_task(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Run one trial attempt in this (fresh) process and return its `TrialResult` as JSON."""
    result = child().run(self.request.id, payload, timeout_errors=(SoftTimeLimitExceeded,))
    if result is None:
        # Withdrawn by the driver, or a redelivery of a trial that already ended: not run.
        if child().withdrawn_of == self.request.id:
            # Celery stored STARTED as the task began, and stores nothing on `Ignore`: a task
            # left STARTED on a live worker reads as running for good, and a driver rerun
            # after an interrupt waited on it without bound. Withdrawn reads as withdrawn.
            # Best effort: raising here would store a failure, and the trial be told FAIL.
            with contextlib.suppress(Exception):
                self.backend.mark_as_revoked(self.request.id, "withdrawn by its driver")
        raise Ignore()
    return result


def _backend_client() -> Any:
    """The result backend's Redis client (the trial's own where the backend is the broker)."""
    assert _app is not None, "set with _room"
    return _app.backend.client


class WorkerStateStep(bootsteps.Step):  # type: ignore[misc]
    """The worker's state made ready as Celery builds the worker, before its pool forks:
    the framework imported, the GPUs cut into slots' shares, a clean device measured."""

    label = "trialq"
    requires = ("celery.worker.components:Pool",)

    def create(self, worker: Any) -> None:
        room().concurrency = int(worker.concurrency or 1)
        room().prepare()


class _BrokerNamedPlainly(logging.Filter):
    """Celery's "Connected to <broker>" names the broker through kombu, which shows a
    password (`redis://:**@`) where there is none and the transport's class path as the
    scheme: the line names the settings' URL instead, its password hidden."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = redacted_url(url)

    def filter(self, record: logging.LogRecord) -> bool:
        """Never drops a record; only rewrites that one line's URL."""
        if record.msg == "Connected to %s":
            record.args = (self.url,)
        return True


def _broker_named_plainly(url: str) -> None:
    connection = logging.getLogger("celery.worker.consumer.connection")
    for old in [f for f in connection.filters if isinstance(f, _BrokerNamedPlainly)]:
        connection.removeFilter(old)
    connection.addFilter(_BrokerNamedPlainly(url))


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


# One handler per signal; each only calls the worker's steps, in the order it states.


@signals.after_setup_logger.connect
def _on_after_setup_logger(logger: logging.Logger, **_: Any) -> None:
    """Every worker line, Celery's too, names its study, trial and attempt (or `-`)."""
    logs.adopt_handlers(logger)


@signals.worker_before_create_process.connect
def _on_worker_before_create_process(**_: Any) -> None:
    _refuse_fork_after_device_use()


@signals.worker_process_init.connect
def _on_worker_process_init(**_: Any) -> None:
    global _child
    if _room is not None:  # else a pool of another app (a test's)
        _child = _room.child(_backend_client)
        _child.prepare()


def code_line(accepts: bool, has_secret: bool) -> str:
    """The ready message's line on trial functions carried as code (`wire/carried_code.py`)."""
    if not accepts:
        return "trial functions carried as code: refused (TRIALQ_ACCEPT_CODE=1 accepts signed ones)"
    if not has_secret:
        return "trial functions carried as code: refused, no secret to check them with"
    return "trial functions carried as code: accepted when signed with this cluster's secret"


@signals.worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Started: freeze what starting built, then start the heartbeat (whose thread and
    client are not among what is frozen)."""
    _freeze_started_worker()
    if _room is None:
        return
    queues = tuple(sorted(sender.app.amqp.queues.consume_from or [DEFAULT_QUEUE]))
    concurrency = sender.pool.num_processes if sender.pool is not None else 1
    _room.start_heartbeat(sender.hostname, queues, concurrency)
    logger.info("%s", code_line(_room.settings.accept_code, _room.settings.seal is not None))


@signals.task_prerun.connect
def _on_task_prerun(sender: Any = None, task_id: str = "", args: Any = (), **_: Any) -> None:
    if getattr(sender, "name", None) == TASK_NAME and _room is not None:
        delivered_on = (sender.request.delivery_info or {}).get("routing_key")
        child().claim(sender.request.hostname, task_id, args[0], delivered_on)


@signals.task_postrun.connect
def _on_task_postrun(
    sender: Any = None, task_id: str = "", state: str | None = None, **_: Any
) -> None:
    if _child is not None:
        # Celery sends postrun from a `finally`: a trial's `sys.exit` passes here too, with
        # no state, its process ending without a word of its own.
        _child.release(returned=state is not None)
    stored = _child is not None and _child.stored_result_of == task_id
    if getattr(sender, "name", None) == TASK_NAME and state == states.SUCCESS and stored:
        _forget_success_meta(sender, task_id)


def _forget_success_meta(task: Any, task_id: str) -> None:
    """Drop the SUCCESS meta Celery has just stored where the trial stored its result under
    trialq's own key first (`trialq.worker.result_store`), which is what the driver
    reads, and forgets once the tell is written (`Dispatcher.forget_results`). Celery stores
    the meta after the trial's own result, often after the driver forgot that task, where it
    would stay for the key TTL (issue 42). Redis away: the TTL removes it."""
    with contextlib.suppress(Exception):
        task.backend.forget(task_id)


@signals.worker_shutting_down.connect
def _on_worker_shutting_down(how: str = "", **_: Any) -> None:
    """A cold shutdown ends the trials at once (the driver sees them lost); a warm one
    (SIGTERM) tells them to stop first."""
    if how == "Warm" and _room is not None:
        _room.preempt(_running_requests())


@signals.worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    if _room is not None:
        _room.stop_heartbeat()
