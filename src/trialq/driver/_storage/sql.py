"""A trial's writes to Optuna's RDB storage, each batch in one transaction of plain SQL.

Optuna's RDB storage commits every write on its own, after reading the trial back through
the ORM: one `ask` over three params is five transactions, a finished trial's dozen user
attrs twelve. `commit_checked` writes a batch of params, attrs, intermediate values and a
state change in one transaction, checked against the database as Optuna checks each write;
`commit_trusted` does the same for several trials, new ones included, trusting the caller's
copy for all but state changes, which is how the driver's `MirroredStorage` writes one step
of the driver in one transaction. A trial is created as Optuna creates it (the study row
locked, the number counted), at once by `insert_trial`, or within the batch for an id
`reserve_trial_ids` took from PostgreSQL's sequence. All of it goes through SQLAlchemy Core
on Optuna's own tables: the ORM's unit of work cost more CPU than PostgreSQL took to run the
statements (benchmarks/driver.py). The tests run them against SQLite and PostgreSQL and
compare with what Optuna itself reads back.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.trial import TrialState

from trialq.errors import ForeignWriter


@dataclass
class TrialWrites:
    """Writes to one trial that the database does not hold yet."""

    params: dict[str, tuple[float, BaseDistribution]] = field(default_factory=dict)
    system_attrs: dict[str, Any] = field(default_factory=dict)
    user_attrs: dict[str, Any] = field(default_factory=dict)
    intermediate_values: dict[int, float] = field(default_factory=dict)
    state: TrialState | None = None
    values: list[float] | None = None
    changed_at: datetime | None = None
    """When the state changed, in local time (now, if not given)."""

    def __bool__(self) -> bool:
        return bool(
            self.params
            or self.system_attrs
            or self.user_attrs
            or self.intermediate_values
            or self.state is not None
        )


@dataclass(frozen=True)
class NewTrial:
    """A trial the database does not hold yet, under an id reserved for it."""

    trial_id: int
    study_id: int
    number: int
    started: datetime
    """When it was asked, in local time."""


def insert_trial(
    rdb: optuna.storages.RDBStorage, study_id: int, number: int, started: datetime
) -> int:
    """The id of a new RUNNING trial of the study, numbered `number` and started at `started`
    (local time, as Optuna shows it). The study must hold exactly `number` trials, counted
    under a lock on its row as Optuna numbers them, or `ForeignWriter` is raised and nothing
    is written."""
    from optuna.storages._rdb import models

    with _transaction(rdb) as connection:
        _check_next_number(connection, study_id, number)
        row = _trial_row(study_id, number, started)
        insert = _insert_into(models.TrialModel.__table__)
        trial_id = connection.execute(insert, row).inserted_primary_key
        assert trial_id is not None
        return int(trial_id[0])


def reserve_trial_ids(rdb: optuna.storages.RDBStorage, n: int) -> list[int] | None:
    """`n` unused trial ids, taken from the database's sequence in one round trip; None where
    the database has no sequence (SQLite, MySQL). An id reserved and never used is a gap, as
    after a rolled-back insert."""
    from optuna.storages._rdb import models

    if rdb.engine.dialect.name != "postgresql":
        return None
    table = models.TrialModel.__table__.name
    with _transaction(rdb) as connection:
        sequence = connection.execute(
            sqlalchemy.text("SELECT pg_get_serial_sequence(:table, 'trial_id')"), {"table": table}
        ).scalar_one_or_none()
        if sequence is None:
            return None
        reserve = sqlalchemy.text("SELECT nextval(:sequence) FROM generate_series(1, :n)")
        ids = connection.execute(reserve, {"sequence": sequence, "n": n}).scalars()
        return [int(i) for i in ids]


def _check_next_number(connection: sqlalchemy.Connection, study_id: int, number: int) -> None:
    """Lock the study's row until the transaction ends, and check that `number` is the next
    trial number: the driver numbers trials from its copy, which a second writer makes wrong."""
    lock, count = _study_statements()
    if connection.execute(lock, {"study_id": study_id}).first() is None:
        raise KeyError(f"No study with study_id {study_id} exists.")
    held = int(connection.execute(count, {"study_id": study_id}).scalar_one())
    if held != number:
        raise ForeignWriter.numbering(held, number)


@functools.cache
def _study_statements() -> tuple[sqlalchemy.Select[Any], sqlalchemy.Select[Any]]:
    """Lock a study's row; count its trials. Built once: building a statement costs more CPU
    than PostgreSQL takes to run it."""
    from optuna.storages._rdb import models

    studies, trials = models.StudyModel.__table__, models.TrialModel.__table__
    study_id: sqlalchemy.BindParameter[int] = sqlalchemy.bindparam("study_id")
    lock = sqlalchemy.select(studies.c.study_id).where(studies.c.study_id == study_id)
    count = sqlalchemy.select(sqlalchemy.func.count()).where(trials.c.study_id == study_id)
    return lock.with_for_update(), count


def _trial_row(study_id: int, number: int, started: datetime) -> dict[str, Any]:
    return {
        "study_id": study_id,
        "number": number,
        "state": TrialState.RUNNING,
        "datetime_start": _stored(started),
    }


def commit_checked(rdb: optuna.storages.RDBStorage, trial_id: int, writes: TrialWrites) -> bool:
    """Write everything in one transaction, for a caller with no copy of the trial: the
    database's trial is checked first, as Optuna checks it. A finished trial raises
    `UpdateFinishedTrialError` for any write, attrs alone included; False, and nothing
    written, where Optuna's own `set_trial_state_values` would return False: a trial set
    RUNNING that was not WAITING."""
    with _transaction(rdb) as connection:
        if not _change_state(rdb, connection, trial_id, writes):
            return False
        _write_rows(connection, {trial_id: writes})
    return True


@dataclass
class Batch:
    """The writes of several trials, the new ones among them created first."""

    writes: dict[int, TrialWrites] = field(default_factory=dict)
    new_trials: list[NewTrial] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.writes or self.new_trials)


def commit_trusted(rdb: optuna.storages.RDBStorage, batches: Sequence[Batch]) -> None:
    """Write the batches, in order, in one transaction, trusting the caller that each write
    may be made (the driver's copy of its study): params, attrs and intermediate values are
    written unchecked; only new trials' numbers and state changes are checked.

    New trials of one study must come in number order; the database must have exactly as many
    trials before them, or `ForeignWriter` is raised and nothing is written. A state change the
    database refuses (the trial was finished by someone else) raises `FinishedElsewhere`, naming
    every such trial of the first batch that has one, and nothing is written either: the caller
    drops those state changes and commits again (`MirroredStorage`)."""
    from optuna.storages._rdb import models

    with _transaction(rdb) as connection:
        for batch in batches:
            first_numbers = {t.study_id: t.number for t in reversed(batch.new_trials)}
            for study_id, number in first_numbers.items():
                _check_next_number(connection, study_id, number)
            if batch.new_trials:
                rows = [
                    {"trial_id": t.trial_id, **_trial_row(t.study_id, t.number, t.started)}
                    for t in batch.new_trials
                ]
                connection.execute(_insert_into(models.TrialModel.__table__), rows)
            refused = [
                trial_id
                for trial_id, writes in batch.writes.items()
                if writes.state is not None
                and not _change_state_unless_finished(rdb, connection, trial_id, writes)
            ]
            if refused:
                raise FinishedElsewhere(refused)
            _write_rows(connection, batch.writes)


class FinishedElsewhere(optuna.exceptions.UpdateFinishedTrialError):
    """Raised when trials the caller would finish are finished in the database already: told
    by another process (optuna-dashboard's Fail button, the `optuna` CLI, a script)."""

    def __init__(self, trial_ids: list[int]) -> None:
        super().__init__(f"trials {trial_ids} are finished in the database already")
        self.trial_ids = trial_ids


def finished_in_database(rdb: optuna.storages.RDBStorage, trial_ids: Sequence[int]) -> list[int]:
    """Which of the trials the database holds as finished, in one query."""
    from optuna.storages._rdb import models

    if not trial_ids:
        return []
    trials = models.TrialModel.__table__
    finished = [state for state in TrialState if state.is_finished()]
    query = sqlalchemy.select(trials.c.trial_id).where(
        trials.c.trial_id.in_(trial_ids), trials.c.state.in_(finished)
    )
    with _transaction(rdb) as connection:
        return [int(trial_id) for trial_id in connection.execute(query).scalars()]


def _change_state_unless_finished(
    rdb: optuna.storages.RDBStorage,
    connection: sqlalchemy.Connection,
    trial_id: int,
    writes: TrialWrites,
) -> bool:
    """Set the trial's new state (`writes.state`, given) in the transaction: True where it
    was set; False, and the trial left as it is, where the database holds it as finished
    already (another process told it). Any other refusal, a trial set RUNNING that was not
    WAITING, raises `UpdateFinishedTrialError`: the caller's copy was wrong about it."""
    try:
        changed = _change_state(rdb, connection, trial_id, writes)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    if not changed:
        assert writes.state is not None
        raise optuna.exceptions.UpdateFinishedTrialError(
            f"trial {trial_id} cannot be set {writes.state.name}: the database refused"
        )
    return True


def _write_rows(connection: sqlalchemy.Connection, batch: Mapping[int, TrialWrites]) -> None:
    """Params, attrs, intermediate values and values of every trial in the batch: one
    statement a table."""
    from optuna.storages._rdb import models

    params = [
        {
            "trial_id": trial_id,
            "param_name": name,
            "param_value": internal,
            "distribution_json": distribution_to_json(distribution),
        }
        for trial_id, writes in batch.items()
        for name, (internal, distribution) in writes.params.items()
    ]
    _insert(connection, models.TrialParamModel, params)  # a param is set once
    for model, attr in (
        (models.TrialSystemAttributeModel, "system_attrs"),
        (models.TrialUserAttributeModel, "user_attrs"),
    ):
        rows = [
            {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
            for trial_id, writes in batch.items()
            for key, value in getattr(writes, attr).items()
        ]
        _upsert(connection, model, rows, key="key")
    _upsert(connection, models.TrialIntermediateValueModel, _report_rows(batch), key="step")
    values = _value_rows(batch)
    _insert(connection, models.TrialValueModel, values)  # with the finishing state, once


def _report_rows(batch: Mapping[int, TrialWrites]) -> list[dict[str, Any]]:
    """The batch's intermediate values as `trial_intermediate_values` rows."""
    from optuna.storages._rdb import models

    to_stored = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr
    rows = []
    for trial_id, writes in batch.items():
        for step, value in writes.intermediate_values.items():
            stored, kind = to_stored(value)
            rows.append(
                {
                    "trial_id": trial_id,
                    "step": step,
                    "intermediate_value": stored,
                    "intermediate_value_type": kind,
                }
            )
    return rows


def _value_rows(batch: Mapping[int, TrialWrites]) -> list[dict[str, Any]]:
    """The batch's objective values as `trial_values` rows."""
    from optuna.storages._rdb import models

    rows = []
    for trial_id, writes in batch.items():
        for objective, value in enumerate(writes.values or ()):
            stored, kind = models.TrialValueModel.value_to_stored_repr(value)
            rows.append(
                {"trial_id": trial_id, "objective": objective, "value": stored, "value_type": kind}
            )
    return rows


def _change_state(
    rdb: optuna.storages.RDBStorage,
    connection: sqlalchemy.Connection,
    trial_id: int,
    writes: TrialWrites,
) -> bool:
    """Set the new state, if any, where Optuna would; check the trial may still be written.

    The UPDATE names the states it may leave, so one statement both checks and writes (and
    locks the row); only a refusal reads the trial to say why."""
    from optuna.storages._rdb import models

    trials = models.TrialModel.__table__
    if writes.state is not None:
        at = _stored(writes.changed_at or datetime.now())
        values = {"trial": trial_id, "new_state": writes.state, "at": at}
        if connection.execute(_state_change(writes.state), values).rowcount == 1:
            return True
    state = connection.execute(
        sqlalchemy.select(trials.c.state).where(trials.c.trial_id == trial_id)
    ).scalar_one_or_none()
    if state is None:
        raise KeyError(f"No trial with trial_id {trial_id} exists.")
    rdb.check_trial_is_updatable(trial_id, state)
    return writes.state is None  # a RUNNING trial set RUNNING again: refused, as Optuna does


@functools.cache
def _state_change(state: TrialState) -> sqlalchemy.Update:
    """Set a trial `state` (parameters: trial, new_state, at) where Optuna would: from
    WAITING to RUNNING, from WAITING or RUNNING to a finished state. Built once a state."""
    from optuna.storages._rdb import models

    trials = models.TrialModel.__table__
    leaving = [TrialState.WAITING]
    if state is not TrialState.RUNNING:
        leaving.append(TrialState.RUNNING)
    at = sqlalchemy.bindparam("at", type_=trials.c.datetime_start.type)
    changes: dict[str, Any] = {
        "state": sqlalchemy.bindparam("new_state", type_=trials.c.state.type)
    }
    if state is TrialState.RUNNING:
        changes["datetime_start"] = at
    if state.is_finished():
        changes["datetime_complete"] = at
    trial: sqlalchemy.BindParameter[int] = sqlalchemy.bindparam("trial")
    where = (trials.c.trial_id == trial, trials.c.state.in_(leaving))
    return sqlalchemy.update(trials).where(*where).values(changes)


@functools.cache
def _insert_into(table: sqlalchemy.Table) -> sqlalchemy.Insert:
    return sqlalchemy.insert(table)


def _insert(connection: sqlalchemy.Connection, model: Any, rows: list[dict[str, Any]]) -> None:
    if rows:
        connection.execute(_insert_into(model.__table__), rows)


def _upsert(
    connection: sqlalchemy.Connection, model: Any, rows: list[dict[str, Any]], key: str
) -> None:
    """Insert the rows, overwriting those of the same trial and `key`, in one statement."""
    if not rows:
        return
    statement = _upsert_statement(connection.dialect, model, key, len(rows))
    if statement is None:  # no upsert in this database: delete, then insert
        table = model.__table__
        keys_by_trial: dict[int, list[Any]] = {}
        for row in rows:
            keys_by_trial.setdefault(row["trial_id"], []).append(row[key])
        for trial_id, keys in keys_by_trial.items():
            connection.execute(
                sqlalchemy.delete(table).where(table.c.trial_id == trial_id, table.c[key].in_(keys))
            )
        connection.execute(_insert_into(table), rows)
        return
    params = {f"{name}_{i}": value for i, row in enumerate(rows) for name, value in row.items()}
    connection.execute(statement, params)


@functools.cache
def _upsert_statement(
    dialect: sqlalchemy.Dialect, model: Any, key: str, n_rows: int
) -> sqlalchemy.TextClause | None:
    """The database's multi-row upsert for `n_rows` rows, or None where it has none.

    Written as SQL text, built once per size: SQLAlchemy's executemany sends an upsert one row
    per round trip, and it compiles a multi-row INSERT built from the values on every call."""
    table = model.__table__
    quote = dialect.identifier_preparer.quote
    columns = [c for c in table.columns if not c.primary_key]
    overwritten = [quote(c.name) for c in columns if c.name not in (key, "trial_id")]
    if dialect.name == "postgresql" or (
        dialect.name == "sqlite" and sqlite3.sqlite_version_info >= (3, 24)
    ):
        on_conflict = f"ON CONFLICT ({quote('trial_id')}, {quote(key)}) DO UPDATE SET " + ", ".join(
            f"{name} = excluded.{name}" for name in overwritten
        )
    elif dialect.name in ("mysql", "mariadb"):
        on_conflict = "ON DUPLICATE KEY UPDATE " + ", ".join(
            f"{name} = VALUES({name})" for name in overwritten
        )
    else:
        return None
    names = ", ".join(quote(c.name) for c in columns)
    rows = ", ".join(
        "(" + ", ".join(f":{c.name}_{i}" for c in columns) + ")" for i in range(n_rows)
    )
    sql = f"INSERT INTO {quote(table.name)} ({names}) VALUES {rows} {on_conflict}"
    types = [
        sqlalchemy.bindparam(f"{c.name}_{i}", type_=c.type) for i in range(n_rows) for c in columns
    ]
    return sqlalchemy.text(sql).bindparams(*types)


def _stored(moment: datetime) -> datetime:
    """A local time as Optuna's RDB storage keeps it: naive UTC."""
    return moment.astimezone(UTC).replace(tzinfo=None)


@contextmanager
def _transaction(rdb: optuna.storages.RDBStorage) -> Iterator[sqlalchemy.Connection]:
    """One transaction on the storage's engine; its errors surface as Optuna's would."""
    try:
        with rdb.engine.begin() as connection:
            yield connection
    except sqlalchemy.exc.IntegrityError:
        raise
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise optuna.exceptions.StorageInternalError(
            f"writing trial data failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        ) from exc
