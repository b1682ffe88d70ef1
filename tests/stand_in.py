"""A stand-in for the dispatcher (no Celery, no Redis), for tests of the driver's loop."""

from __future__ import annotations

from collections.abc import Iterable

from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.messages import TrialRequest, TrialResult


class StandInDispatcher:
    """Answers each submitted attempt with the next scripted result, at once."""

    def __init__(self, script: list[dict[str, object]]) -> None:
        self.script = script
        self.sent: dict[str, TrialRequest] = {}

    def submit(
        self, request: TrialRequest, queue: str, hard_limit_s: float, task_id: str | None = None
    ) -> str:
        assert task_id is not None, "the driver names each attempt before sending it"
        self.sent[task_id] = request
        return task_id

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        found = {}
        for task_id in task_ids:
            request = self.sent[task_id]
            fields = self.script[list(self.sent).index(task_id)]
            result = TrialResult(
                study=request.study, number=request.number, attempt=request.attempt, **fields
            )
            found[task_id] = TaskStatus(TaskPhase.FINISHED, result=result)
        return found

    def pending_ids(self, queue: str) -> set[str]:
        return set()

    def worker_alive(self, worker: str) -> bool:
        return True

    def withdraw(self, task_ids: Iterable[str], queue: str) -> None:
        pass

    def terminate(self, task_id: str) -> None:
        pass

    def live_worker_count(self, queue: str) -> int:
        return 1
