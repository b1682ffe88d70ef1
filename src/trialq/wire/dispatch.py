"""The dispatcher seam between the driver's ask/tell loop and whatever runs trials.

The driver speaks only this protocol; `trialq._celery.dispatcher` implements it over Celery
and Redis, and tests may drive the loop with an in-process stand-in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from trialq.wire.messages import Outcome, TrialRequest, TrialResult


class TaskPhase(StrEnum):
    """Where a sent trial is, as far as the queue can tell."""

    WAITING = "waiting"  # sent, not started (or unknown to the result backend)
    RUNNING = "running"  # a worker process has started it
    FINISHED = "finished"  # the trial process returned a TrialResult
    FAILED = "failed"  # the process never returned one: killed, timed out, revoked


@dataclass(frozen=True)
class TaskStatus:
    """One sent trial's state; `result` when FINISHED, `failure` when FAILED."""

    phase: TaskPhase
    result: TrialResult | None = None
    failure: Outcome | None = None
    detail: str = ""
    worker: str | None = None


class Dispatcher(Protocol):
    """Sends trial requests to workers and tells what became of them."""

    def submit(
        self, request: TrialRequest, queue: str, hard_limit_s: float, task_id: str | None = None
    ) -> str:
        """Send one attempt under `task_id` (the driver records it first), else a new id;
        return the task id."""

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        """The current status of each task id, in one round trip where possible."""

    def pending_ids(self, queue: str) -> set[str]:
        """Task ids the broker still holds for the queue (queued or reserved by a worker)."""

    def worker_alive(self, worker: str) -> bool:
        """Whether the named worker still beats."""

    def withdraw(self, task_ids: Iterable[str], queue: str) -> None:
        """Make sure tasks that have not started never will."""

    def terminate(self, task_id: str) -> None:
        """Stop a running task from outside by killing its process."""

    def live_worker_count(self, queue: str) -> int:
        """How many workers consuming `queue` beat right now."""
