"""A run closes its database connections when it ends: a process that runs study after study
(a notebook calling `trialq.optimize`, a test suite) held two a study until Python's cycle
collector found the engine, and ran PostgreSQL out of them ("too many clients")."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


def _held(postgres_url: str) -> int:
    """Connections to this worker's database other than the one asking."""
    engine = sqlalchemy.create_engine(postgres_url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            asked = "select count(*) from pg_stat_activity where datname = current_database() " \
                "and pid <> pg_backend_pid()"  # fmt: skip
            return int(connection.execute(sqlalchemy.text(asked)).scalar_one())
    finally:
        engine.dispose()


def test_runs_leave_no_connection_to_their_database_open(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    postgres_url: str,
) -> None:
    start_workers(1)
    names = [f"connections-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    gc.disable()  # what is held is held by the run, not waiting for the collector
    try:
        before = _held(postgres_url)
        for name in names:
            spec = write_spec(
                f"""
                [study]
                name = "{name}"
                n_trials = 2
                max_in_flight = 1
                storage = "{postgres_url}"
                [trial]
                entrypoint = "trials:sleeps"
                [space.sleep_s]
                type = "categorical"
                choices = [0.0]
                """,
                name=f"{name}.toml",
            )
            summary = submit_study(spec, Settings(broker_url=redis_url), None, None, None, False)
            assert summary["n_complete"] == 2
        held = _held(postgres_url)
    finally:
        gc.enable()
        for name in names:
            optuna.delete_study(study_name=name, storage=postgres_url)
    assert held == before, f"{held - before} connection(s) left open by 3 runs"
