"""One driver per study: the lock on SQLite (a file beside the database) and on the
machine's real PostgreSQL (an advisory lock), taken, refused, lost with a restart, retaken."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from trialq.driver.study_lock import StudyLock, holding_study, holding_study_file
from trialq.errors import StudyInUse, UsageError


@pytest.fixture
def study(storage_url: str) -> Iterator[optuna.Study]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage_url, study_name=f"lock-{uuid.uuid4().hex[:8]}")
    yield study
    optuna.delete_study(study_name=study.study_name, storage=storage_url)


def _lock(study: optuna.Study) -> StudyLock:
    rdb = study._storage._backend  # Optuna's cache layer over the RDB storage
    return StudyLock(rdb, study._study_id, study.study_name)


@contextlib.contextmanager
def _driving(study: optuna.Study, url: str) -> Iterator[None]:
    """Both locks, as submit-study takes them: SQLite's file, then the server's."""
    with holding_study_file(url, study.study_name), holding_study(study):
        yield


def test_a_second_driver_is_refused_while_the_first_holds_the_study(
    study: optuna.Study, storage_url: str
) -> None:
    with (
        _driving(study, storage_url),
        pytest.raises(StudyInUse, match=r"has a driver already \(trialq-driver .* pid"),
        _driving(study, storage_url),
    ):
        pass
    with _driving(study, storage_url):
        pass  # free again once the first let go


def test_a_sqlite_study_is_locked_before_its_database_exists(tmp_path: Path) -> None:
    """Taken before the database is opened: a second driver is refused before it creates a
    database (beside one moved away) or races the first on Optuna's schema (issue 26.13)."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    with holding_study_file(url, "s"):
        with pytest.raises(StudyInUse, match="has a driver already"), holding_study_file(url, "s"):
            pass
        with holding_study_file(url, "another study"):
            pass  # a lock per study, as on a server
    assert list(tmp_path.iterdir()) == [], "no database, and the lock file removed"


def test_a_lock_beside_no_folder_is_a_usage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no-such-folder' / 'study.db'}"
    with (
        pytest.raises(UsageError, match="cannot create the study's lock"),
        holding_study_file(url, "s"),
    ):
        pass


def test_a_lock_lost_with_the_server_connection_is_taken_again(postgres_url: str) -> None:
    study = optuna.create_study(storage=postgres_url, study_name=f"lock-{uuid.uuid4().hex[:8]}")
    lock = _lock(study)
    lock.acquire()
    engine = sqlalchemy.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as admin:  # this lock's session only: other tests' drivers run too
        admin.execute(
            sqlalchemy.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = :name AND pid <> pg_backend_pid()"
            ),
            {"name": lock._name},
        )
    with pytest.raises(sqlalchemy.exc.OperationalError):
        lock.ensure_held()  # the server forgot the lock with the connection: an outage
    lock.ensure_held()  # the server answers: taken again
    with pytest.raises(StudyInUse):
        _lock(study).acquire()
    lock.release()
    engine.dispose()
    optuna.delete_study(study_name=study.study_name, storage=postgres_url)


def test_a_lock_the_server_still_holds_for_a_session_this_driver_lost_is_taken_back(
    postgres_url: str,
) -> None:
    """A silent network cut: the driver closed its lock connection on its side, but the
    server never heard, and keeps that session (and the lock) until its keepalive, hours on.
    The driver ends that session of its own and takes the lock again, rather than refuse
    itself as 'a driver already'; another driver's lock still refuses it."""
    study = optuna.create_study(storage=postgres_url, study_name=f"lock-{uuid.uuid4().hex[:8]}")
    lock = _lock(study)
    lock.acquire()
    lost = lock._connection
    lock._connection = None  # what the driver's side is left with after the cut

    lock.ensure_held()

    assert lock._connection is not None and lock._connection is not lost
    with pytest.raises(StudyInUse):
        _lock(study).acquire()
    lock.release()
    with contextlib.suppress(sqlalchemy.exc.DBAPIError):
        assert lost is not None
        lost.close()
    optuna.delete_study(study_name=study.study_name, storage=postgres_url)
