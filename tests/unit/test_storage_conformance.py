"""Optuna's own conformance kit for storages, run against the driver's `MirroredStorage` on
SQLite and on the machine's real PostgreSQL; after every case, the copy must agree with what
a fresh `RDBStorage` reads from the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from conftest import TEST_REDIS_URL
from optuna.testing.pytest_storages import StorageTestCase
from studies import trial_fields

from trialq.driver._storage.mirror import MirroredStorage

CONFORMANCE_DATABASE = "trialq_conformance_" + TEST_REDIS_URL.rsplit("/", 1)[-1]
"""A PostgreSQL database of the tests' own: the kit counts every study in the storage. Named
after the run's Redis database, so that test runs side by side do not empty each other's."""


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'kit.db'}"
    return _empty_postgres_database(str(request.getfixturevalue("postgres_url")))


@pytest.fixture
def storage(storage_url: str) -> Iterator[MirroredStorage]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    mirror = MirroredStorage(optuna.storages.RDBStorage(storage_url))
    yield mirror
    mirror.flush()
    _assert_copy_is_the_database(mirror, optuna.storages.RDBStorage(storage_url))
    mirror.backend.engine.dispose()


class TestMirroredStorage(StorageTestCase):
    """Every case of `optuna.testing.pytest_storages.StorageTestCase`."""


def _assert_copy_is_the_database(
    mirror: MirroredStorage, database: optuna.storages.RDBStorage
) -> None:
    studies = database.get_all_studies()
    assert [s._study_id for s in mirror.get_all_studies()] == [s._study_id for s in studies]
    for study in studies:
        copied = mirror.get_all_trials(study._study_id, deepcopy=False)
        stored = database.get_all_trials(study._study_id, deepcopy=False)
        assert [(t._trial_id, trial_fields(t)) for t in copied] == [
            (t._trial_id, trial_fields(t)) for t in stored
        ]
    database.engine.dispose()


def _empty_postgres_database(server_url: str) -> str:
    """The conformance database on the test server, created once and emptied for each case."""
    url = sqlalchemy.make_url(server_url).set(database=CONFORMANCE_DATABASE)
    admin = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        exists = connection.execute(
            sqlalchemy.text("SELECT 1 FROM pg_database WHERE datname = :name"),
            {"name": CONFORMANCE_DATABASE},
        ).first()
        if exists is None:
            connection.execute(sqlalchemy.text(f'CREATE DATABASE "{CONFORMANCE_DATABASE}"'))
    admin.dispose()
    rendered = url.render_as_string(hide_password=False)
    optuna.storages.RDBStorage(rendered).engine.dispose()  # Optuna's tables, once
    engine = sqlalchemy.create_engine(rendered)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("TRUNCATE studies RESTART IDENTITY CASCADE"))
    engine.dispose()
    return rendered
