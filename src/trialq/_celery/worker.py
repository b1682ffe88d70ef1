"""The Celery edge on the worker side: the worker's app, its task and its log lines.

`trialq worker` builds the app from the settings it was given (`build_worker_app`);
`celery -A trialq.worker worker` builds it on first use from the environment's
(`app_from_environment`). The settings in `trialq._celery.app` carry the design: one trial
per process, one message reserved at a time, acknowledged only after the trial ends, JSON
only. The worker's parent may import TensorFlow (`preload`) but never initialises it or a
GPU: it checks that before every fork, and each child at its start.

The app carries the worker it runs (`trialq._celery.lifecycle.TrialqWorker`); its bootstep
(`WorkerLifecycle`) calls the worker's steps at each moment of Celery's worker's life.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any

from celery import Celery, signals
from celery.exceptions import Ignore, SecurityWarning, SoftTimeLimitExceeded

from trialq import logs
from trialq._celery.app import TASK_NAME, create_app
from trialq._celery.lifecycle import WORKER_ATTRIBUTE, TrialqWorker, WorkerLifecycle, worker_of
from trialq._celery.remote_control import LimitedRemoteControl
from trialq.settings import Settings, redacted_url
from trialq.worker.state import WorkerState


def build_worker_app(state: WorkerState) -> Celery:
    """The Celery app that runs `state`'s worker: its task, its bootsteps, its log filter."""
    app = create_app(state.settings)
    app.task(name=TASK_NAME, bind=True, acks_late=True, shared=False)(_run_trial_task)
    setattr(app, WORKER_ATTRIBUTE, TrialqWorker(state, lambda: app.backend.client))
    app.steps["consumer"].add(WorkerLifecycle)
    app.steps["consumer"].add(LimitedRemoteControl)
    _broker_named_plainly(state.settings.broker_url)
    _quiet_about_root(app.conf.accept_content)
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
    """The app `celery -A trialq.worker worker` runs: the worker app this process built
    already (`trialq worker`; Celery keeps the last app built as its current one), else one
    built now, its settings read from the environment once, here, when Celery first asks for
    it (never at an import)."""
    from celery import current_app

    built = current_app._get_current_object()
    return built if worker_of(built) is not None else build_worker_app(WorkerState(Settings()))


def _run_trial_task(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Run one trial attempt in this (fresh) process and return its `TrialResult` as JSON."""
    worker = worker_of(self.app)
    assert worker is not None, "the task is registered only on a worker's app"
    child = worker.child()
    result = child.run(self.request.id, payload, timeout_errors=(SoftTimeLimitExceeded,))
    if result is None:
        # Withdrawn by the driver, or a redelivery of a trial that already ended: not run.
        if child.withdrawn_of == self.request.id:
            # Celery stored STARTED as the task began, and stores nothing on `Ignore`: a task
            # left STARTED on a live worker reads as running for good, and a driver rerun
            # after an interrupt waited on it without bound. Withdrawn reads as withdrawn.
            # Best effort: raising here would store a failure, and the trial be told FAIL.
            with contextlib.suppress(Exception):
                self.backend.mark_as_revoked(self.request.id, "withdrawn by its driver")
        raise Ignore()
    return result


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


@signals.after_setup_logger.connect
def _on_after_setup_logger(logger: logging.Logger, **_: Any) -> None:
    """Every worker line, Celery's too, names its study, trial and attempt (or `-`)."""
    logs.adopt_handlers(logger)
