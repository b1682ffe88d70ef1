"""A study's database read from memory, and written in one transaction a step, beside the loop.

The driver is the single writer of its study's trials (workers never reach the storage), so
after one load the driver's copy of the trials is exactly what the database holds. Optuna's
own cache layer cannot assume that: it re-reads every unfinished trial, with five SELECTs,
on every `get_all_trials`, and TPE calls that several times an ask; and it commits every
param and attr on its own. On PostgreSQL that was 80 % of the driver's time a trial
(benchmarks/driver.py). `MirroredStorage` answers reads from the copy and keeps every write
pending until the next durable point, where all of them, of every trial, go in one
transaction: before a trial is sent (`persist`), when a trial reports a value (a pruner's
decision rests on it), and at the end of each driver step. On PostgreSQL a new trial is not
even inserted at `ask`: its id is reserved from the sequence, and its row goes in with the
rest. So a steady driver step (one trial told, the next asked and sent) is one transaction,
not the three it took (trial created, persisted, told).

That transaction is committed by a writer thread while the driver asks for the next trial
(`flush_behind`; on SQLite, in the caller): most of a commit is waiting on the server, and
the sampler's work needs no database. Commits are made one after another, in order; one that
fails leaves its writes pending, to go first in the next. The driver sends a trial only once
its commit is done, so nothing is ever sent that the database does not hold. A trial told
but not yet written when the driver dies is still RUNNING in the database, with its task id:
the next driver re-attaches it and reads its result from Redis again, so it is told once,
not lost.

A second writer would make the copy wrong, so one is detected where it would do harm: a
new trial whose number is not the next one in the copy stops the run with `ForeignWriter`
(and `trialq.driver.study_lock` keeps a second driver out in the first place). The one writer from
outside that is expected is a person finishing a running trial (optuna-dashboard's Fail
button): `finished_elsewhere` finds it, and a commit that would finish it again drops the
driver's state change for it and writes the rest. That state stands.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Container, Iterable, Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime
from typing import Any

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, check_distribution_compatibility
from optuna.storages import BaseStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.study import StudyDirection
from optuna.study._frozen import FrozenStudy
from optuna.trial import FrozenTrial, TrialState

from trialq.driver._storage.engine import ANSWER_WITHIN_S
from trialq.driver._storage.sql import (
    Batch,
    FinishedElsewhere,
    NewTrial,
    TrialWrites,
    commit_checked,
    commit_trusted,
    finished_in_database,
    insert_trial,
    reserve_trial_ids,
)
from trialq.errors import ForeignWriter, StorageUnreachable

IDS_RESERVED_AT_ONCE = 32

_FINISHED = tuple(state for state in TrialState if state.is_finished())

FLUSH_WAIT_S = 2 * ANSWER_WITHIN_S
"""How long `flush` waits for its commit: one on its way before it, then its own, each
bounded by the engine (`trialq.driver._storage.engine`); so the driver's main thread never
waits unbounded on the writer thread, whatever the database's client library does."""


class _StudyCopy:
    """The trials of one study, by number, and the distribution each param was first given."""

    def __init__(self, trials: Sequence[FrozenTrial]) -> None:
        # Kept in number order: new trials come with the next number (or `ForeignWriter`),
        # and a changed trial keeps its place, so reads need no sort.
        self.trials: dict[int, FrozenTrial] = {
            t.number: t for t in sorted(trials, key=lambda t: t.number)
        }
        self.distributions: dict[str, BaseDistribution] = {}
        for trial in trials:
            for name, distribution in trial.distributions.items():
                self.distributions.setdefault(name, distribution)
        self.unfinished = {t.number for t in trials if not t.state.is_finished()}
        """The numbers of the trials not finished: what Optuna's ask reads (its WAITING
        trials) is found among them, not in every trial of a large study."""

    def put(self, trial: FrozenTrial) -> None:
        """A new or changed trial."""
        self.trials[trial.number] = trial
        if trial.state.is_finished():
            self.unfinished.discard(trial.number)
        else:
            self.unfinished.add(trial.number)


class MirroredStorage(BaseStorage):
    """`backend` (Optuna's RDB storage) with every trial of a loaded study kept in memory."""

    def __init__(
        self, backend: optuna.storages.RDBStorage, write_behind: bool | None = None
    ) -> None:
        """`write_behind`: commit in a background thread while the driver goes on (the
        default, but on SQLite: a local file's commit is quick, and its single writer would
        only queue the driver's own inserts behind the thread's)."""
        self._backend = backend
        self._studies: dict[int, _StudyCopy] = {}
        self._where: dict[int, tuple[int, int]] = {}  # trial id -> (study id, number)
        self._directions: dict[int, list[StudyDirection]] = {}
        self._spare_ids: list[int] = []
        self._has_id_sequence = True
        self._lock = threading.RLock()
        self._open = Batch()  # written to the copy, not yet handed to a commit
        self._failed: list[Batch] = []  # handed to a commit that failed: first in the next
        self._requests: list[Future[None]] = []  # durable points not yet handed to the writer
        self._refused: set[int] = set()  # trials whose state change the database refused
        self._wake_writer = threading.Condition(self._lock)
        self._written = threading.Condition(self._lock)
        self._writer: threading.Thread | None = None
        if write_behind is None:
            write_behind = backend.engine.dialect.name != "sqlite"
        self._write_behind = write_behind

    def __getstate__(self) -> dict[str, Any]:
        """A pickled copy is the database as it is once everything pending is written: its
        trials are loaded again where it is unpickled."""
        self.flush()
        return {"backend": self._backend, "write_behind": self._write_behind}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["backend"], state["write_behind"])  # type: ignore[misc]

    @property
    def backend(self) -> optuna.storages.RDBStorage:
        """The database every write goes to."""
        return self._backend

    # --- studies: few calls, straight through -------------------------------------------------

    def create_new_study(
        self, directions: Sequence[StudyDirection], study_name: str | None = None
    ) -> int:
        return self._backend.create_new_study(directions, study_name)

    def delete_study(self, study_id: int) -> None:
        with self._lock:
            self._directions.pop(study_id, None)
            study = self._studies.pop(study_id, None)
            for trial in study.trials.values() if study else ():
                self._where.pop(trial._trial_id, None)
                self._open.writes.pop(trial._trial_id, None)
            self._open.new_trials = [t for t in self._open.new_trials if t.study_id != study_id]
        self.flush()  # no commit of the study's trials still on its way behind the deletion
        self._backend.delete_study(study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._backend.set_study_user_attr(study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._backend.set_study_system_attr(study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self._backend.get_study_id_from_name(study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self._backend.get_study_name_from_id(study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        """Read once: a study's directions never change (and `best_trial` asks every time)."""
        with self._lock:
            directions = self._directions.get(study_id)
            if directions is None:
                directions = self._directions[study_id] = self._backend.get_study_directions(
                    study_id
                )
        return list(directions)

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self._backend.get_study_user_attrs(study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self._backend.get_study_system_attrs(study_id)

    def get_all_studies(self) -> list[FrozenStudy]:
        return self._backend.get_all_studies()

    # --- trial reads: from the copy ---------------------------------------------------------

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        with self._lock:
            study = self._study(study_id)
            if states is not None and not any(state in states for state in _FINISHED):
                trials = [study.trials[number] for number in sorted(study.unfinished)]
            else:
                trials = list(study.trials.values())
        if states is not None:
            trials = [t for t in trials if t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def get_trial(self, trial_id: int) -> FrozenTrial:
        with self._lock:
            trial = self._mirrored(trial_id)
        return trial if trial is not None else self._backend.get_trial(trial_id)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        with self._lock:
            trial = self._study(study_id).trials.get(trial_number)
        if trial is None:
            return self._backend.get_trial_id_from_study_id_trial_number(study_id, trial_number)
        return trial._trial_id

    # --- trial writes ------------------------------------------------------------------------
    # Every write is pending until `flush`, which writes all of them in one transaction; the
    # copy always shows them. The driver persists a trial before it sends it, so a trial in
    # any queue has its params and task id in the database.

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        with self._lock:
            study = self._study(study_id)
            expected = len(study.trials)
            if template_trial is None:
                # Numbered from the copy; the database checks the number when the row goes in.
                started = datetime.now()
                trial_id = self._reserved_id()
                if trial_id is None:  # no sequence to reserve from: inserted now
                    trial_id = insert_trial(self._backend, study_id, expected, started)
                else:
                    self._open.new_trials.append(NewTrial(trial_id, study_id, expected, started))
                trial = _new_running_trial(trial_id, expected, started)
            else:  # enqueued and added trials: rare, Optuna's own path, after the pending ones
                self.flush()
                created = self._backend._create_new_trial(study_id, template_trial)
                if created.number != expected:  # Optuna numbers it by the database's count
                    raise ForeignWriter.numbering(created.number, expected)
                # Read back: the template's values are as given (an int), the database's
                # as stored (a float).
                trial = self._backend.get_trial(created._trial_id)
            study.put(trial)
            self._where[trial._trial_id] = (study_id, trial.number)
        return trial._trial_id

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: BaseDistribution,
    ) -> None:
        with self._lock:
            trial = self._mirrored(trial_id)
            if trial is None:
                self._backend.set_trial_param(
                    trial_id, param_name, param_value_internal, distribution
                )
                return
            self.check_trial_is_updatable(trial_id, trial.state)
            study = self._studies[self._where[trial_id][0]]
            known = study.distributions.setdefault(param_name, distribution)
            check_distribution_compatibility(known, distribution)
            self._pending(trial_id).params[param_name] = (param_value_internal, distribution)
            value = distribution.to_external_repr(float(param_value_internal))
            self._replace(
                trial,
                params={**trial.params, param_name: value},
                distributions={**trial.distributions, param_name: distribution},
            )

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        with self._lock:
            trial = self._mirrored(trial_id)
            if trial is None:
                self._backend.set_trial_system_attr(trial_id, key, value)
                return
            self.check_trial_is_updatable(trial_id, trial.state)
            self._pending(trial_id).system_attrs[key] = value
            self._replace(trial, system_attrs={**trial.system_attrs, key: value})

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.set_trial_user_attrs(trial_id, {key: value})

    def set_trial_user_attrs(self, trial_id: int, attrs: Mapping[str, Any]) -> None:
        """Several user attrs at once (the driver writes a dozen a trial)."""
        with self._lock:
            trial = self._mirrored(trial_id)
            if trial is None:
                commit_checked(self._backend, trial_id, TrialWrites(user_attrs=dict(attrs)))
                return
            self.check_trial_is_updatable(trial_id, trial.state)
            # A value the trial holds already is not written again (a rewrite would move the
            # row last in optuna-dashboard).
            changed = {k: v for k, v in attrs.items() if trial.user_attrs.get(k, _ABSENT) != v}
            self._pending(trial_id).user_attrs.update(changed)
            self._replace(trial, user_attrs={**trial.user_attrs, **changed})

    def annotate(self, trial_id: int, attrs: Mapping[str, Any]) -> None:
        """User attrs on a trial of the copy however it ended: the driver's note of what it did
        with a trial someone else finished. (Optuna refuses any write to a finished trial; the
        database takes it.)"""
        with self._lock:
            trial = self._mirrored(trial_id)
            assert trial is not None, f"trial {trial_id} is not in the driver's copy"
            self._pending(trial_id).user_attrs.update(attrs)
            self._replace(trial, user_attrs={**trial.user_attrs, **attrs})

    def finished_elsewhere(self, trial_ids: Iterable[int]) -> list[FrozenTrial]:
        """Trials finished in the database by another process (optuna-dashboard's Fail button,
        the `optuna` CLI, a script) while this driver held them: those of `trial_ids` that the
        copy has running, and any whose state change a commit found refused. The state is
        theirs: the copy takes the database's, and a state change of the driver's still
        pending for them is dropped. One query."""
        with self._lock:
            running = [
                trial_id
                for trial_id in trial_ids
                if (trial := self._mirrored(trial_id)) is not None and not trial.state.is_finished()
            ]
        found = set(finished_in_database(self._backend, running))
        with self._lock:
            found |= self._refused
            self._refused = set()
        return [self._take_stored_state(trial_id) for trial_id in sorted(found)]

    def ping(self) -> None:
        """One round trip to the database; raises while it is away."""
        with self._backend.engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT 1"))

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        """Written at once, with everything pending: a pruner's decision rests on it."""
        self.set_trial_intermediate_values(trial_id, {step: intermediate_value})

    def set_trial_intermediate_values(self, trial_id: int, values: Mapping[int, float]) -> None:
        """Several reports of one trial written in one transaction, with everything pending
        (a chatty trial costs the driver one commit a relay, not one a value)."""
        with self._lock:
            trial = self._mirrored(trial_id)
            if trial is None:
                writes = TrialWrites(intermediate_values=dict(values))
                commit_checked(self._backend, trial_id, writes)
                return
            self.check_trial_is_updatable(trial_id, trial.state)
            self._pending(trial_id).intermediate_values.update(values)
            floats = {step: float(value) for step, value in values.items()}
            self._replace(trial, intermediate_values={**trial.intermediate_values, **floats})
            self.flush()

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        """Decided on the copy as Optuna decides on the database (a finished trial refused,
        False for a running trial set RUNNING), and written with the next `flush`."""
        changed_at = datetime.now()
        kept = None if values is None else [float(v) for v in values]  # as the database reads
        with self._lock:
            trial = self._mirrored(trial_id)
            if trial is None:
                writes = TrialWrites(state=state, values=kept, changed_at=changed_at)
                return commit_checked(self._backend, trial_id, writes)
            self.check_trial_is_updatable(trial_id, trial.state)
            if state is TrialState.RUNNING and trial.state is not TrialState.WAITING:
                return False
            pending = self._open.writes.get(trial_id)
            if pending is not None and pending.state is not None:
                self.flush()  # one state change a write: each sets its own times
            writes = self._pending(trial_id)
            writes.state, writes.values, writes.changed_at = state, kept, changed_at
            changes: dict[str, Any] = {"state": state}
            if values is not None:
                changes["values"] = kept
            if state is TrialState.RUNNING:
                changes["datetime_start"] = changed_at
            if state.is_finished():
                changes["datetime_complete"] = changed_at
            self._replace(trial, **changes)
        return True

    def flush(self, wait_s: float = FLUSH_WAIT_S) -> None:
        """Write every pending write of every trial, new trials first, in one transaction, and
        wait for it (and for any commit still on its way), `wait_s` at most.

        If it fails, nothing was written and all of it stays pending, to be written again.
        A commit not done in `wait_s` is `StorageUnreachable` (an outage), its writes still
        on their way. The wait lets go of the copy's lock (callers may hold it), so the writer
        can commit."""
        durable = self.flush_behind()
        deadline = time.monotonic() + wait_s
        with self._lock:
            while not durable.done():
                if not self._written.wait(max(0.0, deadline - time.monotonic())):
                    raise StorageUnreachable(f"no commit done within {wait_s:g} s")
        durable.result()

    def flush_behind(self) -> Future[None]:
        """Hand every pending write to a commit, and go on: the future is done once they are
        in the database, or holds the commit's error (they then stay pending, to be written
        first by the next commit). Commits are made one after another, in order.

        Without write-behind, the commit is made now, and the future is already done."""
        durable: Future[None] = Future()
        with self._lock:
            if not self._write_behind:
                self._write(self._take(), [durable])
                return durable
            self._requests.append(durable)
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_behind_forever, name="trialq-storage-writer", daemon=True
                )
                self._writer.start()
            self._wake_writer.notify()
        return durable

    def _write_behind_forever(self) -> None:
        """The writer thread: commit what is pending each time a durable point is asked for.

        The driver's next ask runs while PostgreSQL commits; the commit waits on the network
        and the server most of its time, and the GIL is free meanwhile."""
        while True:
            with self._lock:
                while not self._requests:
                    self._wake_writer.wait()
                requests, self._requests = self._requests, []
                batches = self._take()
            self._write(batches, requests)

    def _take(self) -> list[Batch]:
        """Everything not yet written, in order: what failed before, then the open batch."""
        batches = [*self._failed, self._open] if self._open else self._failed
        self._failed, self._open = [], Batch()
        return batches

    def _write(self, batches: list[Batch], requests: list[Future[None]]) -> None:
        """Commit the batches and settle the requests; what fails stays, to go first next."""
        error: BaseException | None = None
        try:
            if batches:
                self._commit_yielding_to_others(batches)
        except BaseException as exc:  # an interrupt too: nothing taken may be dropped
            error = exc
        with self._lock:
            if error is not None:
                self._failed = batches + self._failed
            for request in requests:
                if error is None:
                    request.set_result(None)
                else:
                    request.set_exception(error)
            self._written.notify_all()
        if error is not None and not isinstance(error, Exception):
            raise error

    def _commit_yielding_to_others(self, batches: list[Batch]) -> None:
        """Commit; where the database holds a trial as finished by someone else, their state
        stands: the driver's state change for it is dropped and the rest committed. Each retry
        drops at least one, so this ends."""
        while True:
            try:
                self._commit(batches)
                return
            except FinishedElsewhere as exc:
                for trial_id in exc.trial_ids:
                    _drop_state_change(batches, trial_id)
                with self._lock:
                    self._refused.update(exc.trial_ids)

    def _commit(self, batches: list[Batch]) -> None:
        commit_trusted(self._backend, batches)

    def _take_stored_state(self, trial_id: int) -> FrozenTrial:
        """The database's state, values and end time for a trial of the copy."""
        stored = self._backend.get_trial(trial_id)
        with self._lock:
            _drop_state_change([*self._failed, self._open], trial_id)
            trial = self._mirrored(trial_id)
            assert trial is not None
            self._replace(
                trial,
                state=stored.state,
                values=stored.values,
                datetime_complete=stored.datetime_complete,
            )
            refreshed = self._mirrored(trial_id)
        assert refreshed is not None
        return refreshed

    def _pending(self, trial_id: int) -> TrialWrites:
        return self._open.writes.setdefault(trial_id, TrialWrites())

    def _reserved_id(self) -> int | None:
        """An id for a new trial, from the database's sequence; None where it has none."""
        if not self._spare_ids and self._has_id_sequence:
            reserved = reserve_trial_ids(self._backend, IDS_RESERVED_AT_ONCE)
            self._has_id_sequence = reserved is not None
            self._spare_ids = list(reversed(reserved or []))
        return self._spare_ids.pop() if self._spare_ids else None

    # --- the copy --------------------------------------------------------------------------

    def _study(self, study_id: int) -> _StudyCopy:
        """The copy of a study, loaded from the database the first time it is asked for."""
        study = self._studies.get(study_id)
        if study is None:
            trials = self._backend.get_all_trials(study_id, deepcopy=False)
            study = self._studies[study_id] = _StudyCopy(trials)
            for trial in trials:
                self._where[trial._trial_id] = (study_id, trial.number)
        return study

    def _mirrored(self, trial_id: int) -> FrozenTrial | None:
        """The copy's trial, or None for a trial of a study this driver has not loaded."""
        where = self._where.get(trial_id)
        return None if where is None else self._studies[where[0]].trials[where[1]]

    def _replace(self, trial: FrozenTrial, **changes: Any) -> None:
        """Store a changed copy of the trial: objects already handed out keep their values."""
        changed = copy.copy(trial)
        for name, value in changes.items():
            setattr(changed, name, value)
        self._studies[self._where[trial._trial_id][0]].put(changed)


_ABSENT = object()


def _drop_state_change(batches: Iterable[Batch], trial_id: int) -> None:
    for batch in batches:
        writes = batch.writes.get(trial_id)
        if writes is not None:
            writes.state, writes.values, writes.changed_at = None, None, None


def _new_running_trial(trial_id: int, number: int, started: datetime) -> FrozenTrial:
    return FrozenTrial(
        number=number,
        state=TrialState.RUNNING,
        value=None,
        values=None,
        datetime_start=started,
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={},
        system_attrs={},
        intermediate_values={},
        trial_id=trial_id,
    )


def rdb_under(storage: BaseStorage) -> optuna.storages.RDBStorage | None:
    """The RDB storage under the mirror or under Optuna's cache layer; None for any other.

    The cache layer's `_backend` is read without a default: if an Optuna upgrade renames it,
    this fails loudly instead of running unmirrored and without the study lock
    (docs/design.md, "Private hooks we lean on").
    """
    if isinstance(storage, MirroredStorage):
        return storage.backend
    if isinstance(storage, _CachedStorage):
        storage = storage._backend
    return storage if isinstance(storage, optuna.storages.RDBStorage) else None


def mirrored(storage: BaseStorage) -> BaseStorage:
    """An RDB storage (bare or in Optuna's cache layer) mirrored; any other as it is."""
    backend = rdb_under(storage)
    return storage if backend is None else MirroredStorage(backend)
