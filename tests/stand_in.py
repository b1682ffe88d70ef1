"""A stand-in for the dispatcher and its report channel (no Celery, no Redis), for tests of
the driver's loop."""

from __future__ import annotations

import time
from collections.abc import Iterable

from trialq.wire.channel import Report, TrialAddress
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.messages import Outcome, TrialRequest, TrialResult


class StandInReports:
    """A stand-in for the report channel: each attempt's scripted intermediate values, all
    there from its start; the prune flags the driver raised."""

    def __init__(self) -> None:
        self.values: dict[TrialAddress, list[float]] = {}
        self.prune_requested: set[TrialAddress] = set()
        self.stopped: set[TrialAddress] = set()
        self.orphaned: list[str] = []

    def read_new(self, positions: dict[TrialAddress, str]) -> dict[TrialAddress, list[Report]]:
        found = {}
        for address, last in positions.items():
            values = self.values.get(address, [])
            seen = int(last)
            if seen < len(values):
                found[address] = [
                    Report(str(step + 1), step, values[step]) for step in range(seen, len(values))
                ]
        return found

    def request_prune(self, address: TrialAddress) -> None:
        self.prune_requested.add(address)

    def memory_exceeded(self, address: TrialAddress) -> int | None:
        return None

    def stop_requested(self, address: TrialAddress) -> bool:
        return address in self.stopped

    def orphan_checkpoint(self, key: str) -> None:
        self.orphaned.append(key)

    def forget(self, *addresses: TrialAddress) -> None:
        for address in addresses:
            self.values.pop(address, None)


class StandInDispatcher:
    """Answers each submitted attempt with the next scripted result, at once. A scripted
    result with `reports` (intermediate values) runs for one poll first, and ends PRUNED if
    the driver raised its prune flag by then; its `late_reports` are written as it finishes,
    after the driver's last look at the channel (a curve's last steps and its result can
    arrive in the same pass)."""

    def __init__(self, script: list[dict[str, object]]) -> None:
        self.script = script
        self.sent: dict[str, TrialRequest] = {}
        self.channel = StandInReports()
        self._polled: set[str] = set()
        self._finished: set[str] = set()
        self._announced: set[str] = set()
        self.forgotten: list[str] = []
        """The attempts whose results the driver let go of (`forget_results`), in order."""
        self.waits: list[tuple[float, bool]] = []
        """Each `wait_for_results`: the timeout the driver gave, and whether a result woke
        it (every sent attempt's result is there at once, so one sent wakes it at once)."""

    def submit(self, request: TrialRequest, queue: str, task_id: str | None = None) -> str:
        assert task_id is not None, "the driver names each attempt before sending it"
        self.sent[task_id] = request
        reports = self._fields(task_id).get("reports")
        if isinstance(reports, list):
            self.channel.values[_address(request)] = [float(v) for v in reports]
        return task_id

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        found = {}
        for task_id in task_ids:
            request = self.sent[task_id]
            scripted = self._fields(task_id)
            fields = {k: v for k, v in scripted.items() if k not in ("reports", "late_reports")}
            if "reports" in self._fields(task_id) and task_id not in self._polled:
                self._polled.add(task_id)
                found[task_id] = TaskStatus(TaskPhase.RUNNING)
                continue
            if _address(request) in self.channel.prune_requested:
                fields = {"outcome": Outcome.PRUNED}
            late = scripted.get("late_reports")
            if isinstance(late, list) and task_id not in self._finished:
                self._finished.add(task_id)
                self.channel.values.setdefault(_address(request), []).extend(map(float, late))
            result = TrialResult(
                study=request.study, number=request.number, attempt=request.attempt, **fields
            )
            found[task_id] = TaskStatus(TaskPhase.FINISHED, result=result)
        return found

    def _fields(self, task_id: str) -> dict[str, object]:
        return self.script[list(self.sent).index(task_id)]

    def reports(self) -> StandInReports:
        return self.channel

    def questions(self) -> None:
        return None  # stand-in trials ask nothing

    def pending_ids(self, queue: str) -> set[str]:
        return set()

    def worker_alive(self, worker: str) -> bool:
        return True

    def attempt_alive(self, task_id: str) -> bool:
        return True

    def withdraw(self, task_ids: Iterable[str], queue: str) -> None:
        pass

    def terminate(self, task_id: str) -> None:
        pass

    def live_worker_count(self, queue: str) -> int:
        return 1

    def forget_results(self, task_ids: Iterable[str]) -> None:
        self.forgotten.extend(task_ids)

    def results_announced(self) -> set[str] | None:
        """Each sent attempt once its result is there (at once, or after its one running
        poll), as a trial process announces the result it stored."""
        there = {
            task_id
            for task_id in self.sent
            if task_id not in self._announced
            and ("reports" not in self._fields(task_id) or task_id in self._polled)
        }
        self._announced |= there
        return there

    def wait_for_results(self, timeout_s: float) -> bool:
        woken = bool(self.sent)
        self.waits.append((timeout_s, woken))
        if not woken:
            time.sleep(timeout_s)
        return woken


def _address(request: TrialRequest) -> TrialAddress:
    return TrialAddress.of(request)
