"""A run closes its database connections when it ends: a process that runs study after study
(a notebook calling `trialq.optimize`, a test suite) held two a study until Python's cycle
collector found the engine, and ran PostgreSQL out of them ("too many clients")."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Callable
from pathlib import Path

import optuna
import psutil
import pytest
import sqlalchemy

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


def _held(postgres_url: str) -> int:
    """This process's open connections to the database's server: other processes (a driver
    another test started in a subprocess) are not this run's."""
    port = sqlalchemy.make_url(postgres_url).port or 5432
    process = psutil.Process()
    # `net_connections` since psutil 6; the oldest psutil admitted (5.9) calls it `connections`
    listing = getattr(process, "net_connections", None) or process.connections
    return sum(
        1
        for connection in listing(kind="tcp")
        if connection.raddr and connection.raddr.port == port
        and connection.status == psutil.CONN_ESTABLISHED
    )  # fmt: skip


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
