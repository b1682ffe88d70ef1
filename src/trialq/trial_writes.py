"""Many writes to one trial in one transaction of Optuna's RDB storage.

Optuna's RDB storage commits every write on its own, after reading the trial again: one
`ask` over three params is five transactions, a finished trial's dozen user attrs twelve.
On PostgreSQL each costs 1-4 ms, more than the sampler's own work. `commit` writes a batch of
params, attrs, intermediate values and a state change in one transaction. It leans on
Optuna's RDB models and session helper, so the tests run it against SQLite and PostgreSQL.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution, distribution_to_json
from optuna.trial import TrialState
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.dialects import sqlite as sqlite_dialect


@dataclass
class TrialWrites:
    """Writes to one trial that the database does not hold yet."""

    params: dict[str, tuple[float, BaseDistribution]] = field(default_factory=dict)
    system_attrs: dict[str, Any] = field(default_factory=dict)
    user_attrs: dict[str, Any] = field(default_factory=dict)
    intermediate_values: dict[int, float] = field(default_factory=dict)
    state: TrialState | None = None
    values: list[float] | None = None

    def __bool__(self) -> bool:
        return bool(
            self.params
            or self.system_attrs
            or self.user_attrs
            or self.intermediate_values
            or self.state is not None
        )


def commit(rdb: optuna.storages.RDBStorage, trial_id: int, writes: TrialWrites) -> bool:
    """Write everything in one transaction. False, and nothing written, where Optuna's own
    `set_trial_state_values` would refuse: a trial set RUNNING that was not WAITING."""
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    with _create_scoped_session(rdb.scoped_session) as session:
        lock = writes.state is not None
        trial: Any = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=lock)
        rdb.check_trial_is_updatable(trial_id, trial.state)
        if writes.state is TrialState.RUNNING and trial.state != TrialState.WAITING:
            session.rollback()
            return False
        if writes.params:
            rows = [
                {
                    "trial_id": trial_id,
                    "param_name": name,
                    "param_value": internal,
                    "distribution_json": distribution_to_json(distribution),
                }
                for name, (internal, distribution) in writes.params.items()
            ]
            session.execute(sqlalchemy.insert(models.TrialParamModel), rows)
        for model, attrs in (
            (models.TrialSystemAttributeModel, writes.system_attrs),
            (models.TrialUserAttributeModel, writes.user_attrs),
        ):
            _write_attrs(rdb, session, model, trial_id, attrs)
        for step, value in writes.intermediate_values.items():
            rdb._set_trial_intermediate_value_without_commit(session, trial_id, step, value)
        if writes.state is not None:
            for objective, value in enumerate(writes.values or ()):
                rdb._set_trial_value_without_commit(session, trial, objective, value)
            trial.state = writes.state
            if writes.state is TrialState.RUNNING:
                trial.datetime_start = datetime.now()
            if writes.state.is_finished():
                trial.datetime_complete = datetime.now()
    return True


def _write_attrs(
    rdb: optuna.storages.RDBStorage,
    session: Any,
    model: Any,
    trial_id: int,
    attrs: Mapping[str, Any],
) -> None:
    """All attrs in one statement that overwrites existing keys, where the dialect has one."""
    if not attrs:
        return
    upsert = _upsert(rdb.engine.name, model)
    if upsert is None:
        for key, value in attrs.items():
            rdb._set_trial_attr_without_commit(session, model, trial_id, key, value)
        return
    rows = [
        {"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
        for key, value in attrs.items()
    ]
    session.execute(upsert, rows)


@functools.cache
def _upsert(dialect: str, model: Any) -> Any:
    """An INSERT that overwrites an existing key, built once (SQLAlchemy caches its SQL)."""
    if dialect == "postgresql" or (dialect == "sqlite" and sqlite3.sqlite_version_info >= (3, 24)):
        insert = (postgresql if dialect == "postgresql" else sqlite_dialect).insert(model)
        return insert.on_conflict_do_update(
            index_elements=[model.trial_id, model.key],
            set_={"value_json": insert.excluded.value_json},
        )
    if dialect == "mysql":
        insert = mysql.insert(model)
        return insert.on_duplicate_key_update(value_json=insert.inserted.value_json)
    return None
