"""The dispatcher seam between the driver's ask/tell loop and whatever runs trials.

The driver speaks only this protocol; `trialq._celery.dispatcher` implements it over Celery
and Redis, and tests may drive the loop with an in-process stand-in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from trialq.wire.channel import Report, TrialAddress
from trialq.wire.messages import Outcome, TrialRequest, TrialResult
from trialq.wire.suggest import QuestionChannel


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
    withdrawn: bool = False
    """FAILED because a driver withdrew it before it ran (revoked): not the trial's doing."""
    beating: bool | None = None
    """Whether the attempt's trial process renewed its beacon, read with this status; None
    where the dispatcher did not read it (then `Dispatcher.attempt_alive` is asked)."""
    log_file: str | None = None
    """The attempt's own log file, as its beacon names it (read with `beating`)."""


class TrialReports(Protocol):
    """The driver's end of what running trials report: intermediate values in, prune flags
    out (`trialq.wire.channel.ReportChannel` over Redis). Its errors are trialq's:
    `BrokerUnreachable` while the broker is away, else `BrokerError` (`trialq.errors`)."""

    def read_new(self, positions: dict[TrialAddress, str]) -> dict[TrialAddress, list[Report]]:
        """Reports after each address's last seen id ('0' for none)."""

    def request_prune(self, address: TrialAddress) -> None:
        """Ask the attempt at `address` to stop (`trial.should_prune()` turns true)."""

    def memory_exceeded(self, address: TrialAddress) -> int | None:
        """The RSS at which a lost attempt killed itself for its memory limit, if it did."""

    def stop_requested(self, address: TrialAddress) -> bool:
        """Whether the attempt was told to stop (a preemption notice)."""

    def orphan_checkpoint(self, key: str) -> None:
        """Ask a later trial process to remove a finished trial's checkpoint folder."""

    def forget(self, *addresses: TrialAddress) -> None:
        """Drop what attempts reported, once their trials are told (all in one call)."""


class Dispatcher(Protocol):
    """Sends trial requests to workers and tells what became of them. Its errors are
    trialq's: `BrokerUnreachable` while the broker is away (the driver rides it out), else
    `BrokerError` (`trialq.errors`); never its transport's own."""

    def reports(self) -> TrialReports:
        """Where the trials sent through this dispatcher report."""

    def questions(self) -> QuestionChannel | None:
        """Where the trials sent through this dispatcher ask their driver (a param's value, a
        verdict: `trialq.wire.suggest`); None where they cannot (they then get no answer,
        and a trial that suggests a param not carried ends as a lost one)."""

    def submit(self, request: TrialRequest, queue: str, task_id: str | None = None) -> str:
        """Send one attempt under `task_id` (the driver records it first), else a new id;
        return the task id. Its time limits are the request's (`timeout_s`, `hard_limit_s`)."""

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        """The current status of each task id, in one round trip where possible. A result is
        FINISHED only where it is trusted (signed for its task with the deployment's secret,
        where there is one: `trialq.wire.signing`); one set aside counts as none."""

    def pending_ids(self, queue: str) -> set[str]:
        """Task ids the broker still holds for the queue (queued or reserved by a worker)."""

    def worker_alive(self, worker: str) -> bool:
        """Whether the named worker still beats."""

    def attempt_alive(self, task_id: str) -> bool:
        """Whether the process running the attempt still beats, whatever its worker's parent
        does (frozen, cut off from Redis): its result is still to come."""

    def withdraw(self, task_ids: Iterable[str], queue: str) -> None:
        """Make sure tasks that have not started never will."""

    def terminate(self, task_id: str) -> None:
        """Stop a running task from outside by killing its process."""

    def live_worker_count(self, queue: str) -> int:
        """How many workers consuming `queue` beat right now."""

    def forget_results(self, task_ids: Iterable[str]) -> None:
        """Drop what the broker keeps of finished attempts (their results, the queue's
        record of them), in one round trip. Called only once their tells are durable: a
        driver that dies before reads the results again (docs/deployment.md, "Sizing Redis")."""

    def wait_for_results(self, timeout_s: float) -> bool:
        """Wait until a trial sent through this dispatcher may have ended, or `timeout_s`
        has passed; True when woken early by a result. The driver's pause between passes:
        a pass follows each result at once instead of a fixed sleep later. A dispatcher
        that cannot tell waits the whole `timeout_s` (a sleep, or its own clock)."""

    def results_announced(self) -> set[str] | None:
        """The task ids whose results were announced since the last call, each given once:
        the pass that follows reads only those, and every trial in flight now and then
        (`trialq.driver.pacing.PassPacing`). None where some may have gone unheard, or this
        dispatcher cannot tell: that pass reads every trial in flight."""
