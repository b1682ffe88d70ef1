"""Optuna's own conformance kit for storages, run against the driver's `MirroredStorage` on
SQLite and on the machine's real PostgreSQL; after every case, the copy must agree with what
a fresh `RDBStorage` reads from the database."""

from __future__ import annotations

from collections.abc import Iterator

import optuna
import pytest
import sqlalchemy
from optuna.testing.pytest_storages import StorageTestCase
from services import TEST_REDIS_URL
from studies import trial_fields

from trialq.driver._storage.mirror import MirroredStorage

CONFORMANCE_DATABASE = "trialq_conformance_" + TEST_REDIS_URL.rsplit("/", 1)[-1]
"""A PostgreSQL database of the tests' own: the kit counts every study in the storage. Named
after the run's Redis database, so that test runs side by side do not empty each other's."""


@pytest.fixture
def kit_url(storage_url: str) -> str:
    """The shared storage URL; on PostgreSQL, an emptied database of the kit's own."""
    if storage_url.startswith("sqlite"):
        return storage_url
    return _empty_postgres_database(storage_url)


@pytest.fixture
def storage(kit_url: str) -> Iterator[MirroredStorage]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    mirror = MirroredStorage(optuna.storages.RDBStorage(kit_url))
    yield mirror
    mirror.flush()
    _assert_copy_is_the_database(mirror, optuna.storages.RDBStorage(kit_url))
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
