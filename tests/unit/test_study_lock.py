"""One driver per study: the lock on SQLite (a file beside the database) and on the
machine's real PostgreSQL (an advisory lock), taken, refused, lost with a restart, retaken."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import optuna
import pytest
import sqlalchemy

from trialq.driver.study_lock import StudyLock
from trialq.errors import StudyInUse


@pytest.fixture
def study(storage_url: str) -> Iterator[optuna.Study]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage_url, study_name=f"lock-{uuid.uuid4().hex[:8]}")
    yield study
    optuna.delete_study(study_name=study.study_name, storage=storage_url)


def _lock(study: optuna.Study) -> StudyLock:
    rdb = study._storage._backend  # Optuna's cache layer over the RDB storage
    return StudyLock(rdb, study._study_id, study.study_name)


def test_a_second_driver_is_refused_while_the_first_holds_the_study(
    study: optuna.Study,
) -> None:
    first = _lock(study)
    first.acquire()
    with pytest.raises(StudyInUse, match=r"has a driver already \(trialq-driver .* pid"):
        _lock(study).acquire()
    first.release()
    second = _lock(study)
    second.acquire()  # free again once the first let go
    second.release()


def test_a_lock_lost_with_the_server_connection_is_taken_again(postgres_url: str) -> None:
    study = optuna.create_study(storage=postgres_url, study_name=f"lock-{uuid.uuid4().hex[:8]}")
    lock = _lock(study)
    lock.acquire()
    engine = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as admin:
        admin.execute(
            sqlalchemy.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE 'trialq-driver%' AND pid <> pg_backend_pid()"
            )
        )
    with pytest.raises(sqlalchemy.exc.OperationalError):
        lock.ensure_held()  # the server forgot the lock with the connection: an outage
    lock.ensure_held()  # the server answers: taken again
    with pytest.raises(StudyInUse):
        _lock(study).acquire()
    lock.release()
    engine.dispose()
    optuna.delete_study(study_name=study.study_name, storage=postgres_url)
