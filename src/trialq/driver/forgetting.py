"""Letting go of told trials' results in the broker, once their tells are in the database.

Each attempt leaves its result in Redis (trialq's and Celery's task meta, 2 KB) for the key
TTL, a week: a long study filled the broker. A told trial's result is needed
until its tell is durable, no longer: a driver that dies between finds the trial RUNNING
in the database with its task id and reads the result again (`trialq.driver.loop`,
re-attach). So a told attempt is remembered with the commit that carries its tell, and its
result is dropped (`Dispatcher.forget_results`) once that commit is done; a commit that
failed leaves its writes for the next, and its attempts wait for that one.
"""

from __future__ import annotations

from concurrent.futures import Future

from trialq.wire.dispatch import Dispatcher


class Forgetting:
    """Told attempts whose results are dropped from the broker once their tells are written."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._told: list[str] = []  # told since the last commit was asked for
        self._writing: list[tuple[Future[None], list[str]]] = []  # in commits on their way

    def told(self, task_id: str) -> None:
        """An attempt was told: its result goes once the next commit is done."""
        self._told.append(task_id)

    def committing(self, written: Future[None]) -> None:
        """The attempts told so far are in the commit `written`."""
        if self._told:
            self._writing.append((written, self._told))
            self._told = []

    def forget_written(self) -> None:
        """Drop the results of attempts whose commit is done; a failed commit's attempts
        wait for the next one."""
        done: list[tuple[Future[None], list[str]]] = []
        pending: list[tuple[Future[None], list[str]]] = []
        for entry in self._writing:  # asked once: a commit may end while this runs
            (done if entry[0].done() else pending).append(entry)
        if not done:
            return
        written = [i for future, ids in done if future.exception() is None for i in ids]
        failed = [i for future, ids in done if future.exception() is not None for i in ids]
        self._dispatcher.forget_results(written)  # raises while the broker is away: kept
        self._writing = pending
        self._told = failed + self._told

    def all_written(self) -> None:
        """Every tell is durable (the run's last flush returned): drop every result."""
        ids = [i for _, ids in self._writing for i in ids] + self._told
        self._dispatcher.forget_results(ids)
        self._writing, self._told = [], []
