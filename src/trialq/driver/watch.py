"""Watching the trials in flight: what the queue, the workers' heartbeats and the report
channel say of each attempt in a pass, gathered into the fate rule's `Known`
(`trialq.driver.fate`), and what the storage says of trials finished by someone else."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from optuna.trial import FrozenTrial

from trialq.driver import fate
from trialq.driver._storage.store import TrialStore
from trialq.driver.fate import Known
from trialq.driver.in_flight import InFlight
from trialq.driver.pacing import Periodic
from trialq.driver.sampling.oom_constraint import OomTelling
from trialq.driver.study_lock import StudyLock
from trialq.wire.dispatch import Dispatcher, TaskPhase, TaskStatus, TrialReports


class Watch:
    """Asks the queue and the report channel what became of each attempt in flight."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        channel: TrialReports,
        queue: str,
        clock: Callable[[], float],
        lost_check_interval_s: float,
        prune_grace_s: float,
        oom_telling: Callable[[], OomTelling | None],
    ) -> None:
        self._dispatcher, self._channel, self._queue = dispatcher, channel, queue
        self._clock, self._prune_grace_s, self._oom_telling = clock, prune_grace_s, oom_telling
        self._lost_check = Periodic(lost_check_interval_s)

    def queued_ids(self) -> set[str] | None:
        """The ids the broker still holds, every few seconds (the lost check); else None."""
        started = self._clock()
        if not self._lost_check.due(started):
            return None
        queued = self._dispatcher.pending_ids(self._queue)
        self._lost_check.took(started, self._clock())
        return queued

    def known(self, entry: InFlight, status: TaskStatus, queued: set[str] | None) -> Known:
        """What the queue and the report channel say of one attempt in this pass."""
        alive = self._alive(entry, status)
        claim_lost = self._claim_lost(entry, status, queued)
        lost = fate.may_be_lost(status, alive, claim_lost)
        oom_rss = self._channel.memory_exceeded(entry.address) if lost else None
        return Known(
            request=entry.request,
            status=status,
            resends=entry.resends,
            worker_alive=alive,
            queued=None if queued is None else entry.task_id in queued,
            claim_lost=claim_lost,
            unseen_checks=entry.unseen_checks,
            prune_overdue=self._prune_overdue(entry),
            terminated=entry.terminated,
            oom_rss=oom_rss,
            stop_requested=lost and self._channel.stop_requested(entry.address),
            oom_telling=self._oom_telling() if fate.may_tell_oom(status, oom_rss) else None,
        )

    def _claim_lost(self, entry: InFlight, status: TaskStatus, queued: set[str] | None) -> bool:
        """On a lost check, for an attempt Celery still has waiting: whether a trial process
        claimed it (its beacon seen on an earlier check) and beats no more. Its process writes
        the beacon just before Celery stores `STARTED`; a host lost in between leaves the
        message reserved until the visibility timeout (docs/reliability.md)."""
        if status.phase is not TaskPhase.WAITING or queued is None:
            return False
        beating = self._beating(entry, status)
        lost = entry.claimed and not beating
        entry.claimed = entry.claimed or beating
        return lost

    def _alive(self, entry: InFlight, status: TaskStatus) -> bool:
        """For a running attempt: whether its trial process still beats. Once its beacon was
        seen, the beacon alone says so: a worker's heartbeat is kept fresh by any process of
        its name, a twin started with the same `--hostname` too, and a lost attempt would be
        waited for forever (issue 38, row 6). Until then (a beacon not yet written, a worker
        too old to write one) its worker's heartbeat does, asked only then."""
        if status.phase is not TaskPhase.RUNNING:
            return True
        if self._beating(entry, status):
            return True
        if entry.beacon_seen:
            return False
        return not status.worker or self._dispatcher.worker_alive(status.worker)

    def _beating(self, entry: InFlight, status: TaskStatus) -> bool:
        """Whether the attempt's trial process renews its beacon: as read with its status
        where the dispatcher read it there, else asked now. A beacon outlives its process by
        the heartbeat's TTL, so a pass every few seconds sees it at least once."""
        beating = (
            status.beating
            if status.beating is not None
            else self._dispatcher.attempt_alive(entry.task_id)
        )
        entry.beacon_seen = entry.beacon_seen or beating
        if beating:
            entry.saw_running()
        return beating

    def _prune_overdue(self, entry: InFlight) -> bool:
        asked = entry.prune_requested_at
        return (
            asked is not None
            and not entry.terminated
            and self._clock() - asked > self._prune_grace_s
        )


class OutsideCheck:
    """Every few seconds: whether this driver still holds its study, and which trials in
    flight someone else finished (optuna-dashboard's Fail button is "stop this trial now")."""

    def __init__(
        self,
        store: TrialStore,
        study_lock: StudyLock | None,
        clock: Callable[[], float],
        interval_s: float,
    ) -> None:
        self._store, self._study_lock, self._clock = store, study_lock, clock
        self._check = Periodic(interval_s)

    def finished_elsewhere(
        self, in_flight: Iterable[InFlight]
    ) -> list[tuple[InFlight | None, FrozenTrial]]:
        """The trials in flight finished from outside, each with its entry (None: its result
        came in as it was finished there); nothing while the check is not due."""
        started = self._clock()
        if not self._check.due(started):
            return []
        if self._study_lock is not None:
            self._study_lock.ensure_held()
        by_trial = {entry.trial._trial_id: entry for entry in in_flight}
        finished = self._store.finished_elsewhere(by_trial)
        self._check.took(started, self._clock())
        return [(by_trial.get(frozen._trial_id), frozen) for frozen in finished]
