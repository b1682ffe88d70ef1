"""The worker's remote control, limited to what trialq's driver and a monitor need.

Celery's workers obey any control message on the broker: anyone who can write to it could
`celery control shutdown` every worker, restart their pools, stop them consuming the queue
or change a task's time limits. A trialq worker answers only the driver's
`revoke` (a withdrawn trial, a trial killed for its pruner: SIGKILL or SIGTERM only),
Flower's read-only questions and its `enable_events`; any other command is refused, in one
line of the worker's log and in its reply to a sender that waits for one.
"""

from __future__ import annotations

import functools
import logging
import signal
from typing import Any

from celery import bootsteps
from celery.platforms import signals as celery_signals
from celery.worker import control

CONTROL_STEP = "celery.worker.consumer.control.Control"
"""Celery's consumer step that answers remote control (its `box` holds the handlers)."""

READ_ONLY = (
    "ping", "stats", "active", "reserved", "scheduled", "revoked", "registered",
    "active_queues", "query_task", "report", "clock", "conf",
)  # fmt: skip
"""Questions Flower's worker pages ask; none changes the worker (`conf` shows the settings
with Celery's censoring of passwords and keys). Not `objgraph`, `memdump` or `memsample`
(costly to answer), nor `hello` (mingle, which trialq turns off)."""

IDEMPOTENT = ("enable_events",)
"""Flower sends `enable_events` every 5 s; a trialq worker sends its events anyway
(`worker_send_task_events`), so answering changes nothing, and refusing it would log a line
every 5 s. Its opposite, `disable_events`, is refused: it would blind Flower."""

logger = logging.getLogger("trialq.worker")  # the worker's other lines' name

TERMINATING_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM})
"""What a revoke may terminate a trial with: the driver's SIGKILL, Flower's SIGTERM."""


def revoke(state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kw: Any) -> Any:
    """Celery's revoke, refusing a signal that would not end the trial (SIGSTOP, say)."""
    if terminate and celery_signals.signum(signal or "SIGTERM") not in TERMINATING_SIGNALS:
        return control.nok(f"revoke: signal {signal!r} refused (SIGKILL or SIGTERM only)")
    return control.revoke(state, task_id, terminate=terminate, signal=signal, **kw)


class AllowedCommands(dict[str, Any]):
    """The handlers a trialq worker answers, by command name; any other is refused."""

    def __missing__(self, command: str) -> Any:
        return functools.partial(_refused, command)


def allowed_commands() -> AllowedCommands:
    """The commands a trialq worker answers: `revoke` and `READ_ONLY`."""
    read_only = {name: control.Panel.data[name] for name in READ_ONLY + IDEMPOTENT}
    return AllowedCommands({"revoke": revoke, **read_only})


def _refused(command: str, state: Any, **arguments: Any) -> Any:
    logger.warning(
        "remote control command %r refused: a trialq worker answers only revoke and questions",
        command,
    )
    return control.nok(f"{command}: refused by this trialq worker")


class LimitedRemoteControl(bootsteps.Step):  # type: ignore[misc]
    """Gives Celery's remote control only `allowed_commands` before it starts listening."""

    label = "trialq remote control"
    requires = (CONTROL_STEP,)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        step = consumer.blueprint.steps.get(CONTROL_STEP)
        if step is not None:
            step.box.node.handlers = allowed_commands()
