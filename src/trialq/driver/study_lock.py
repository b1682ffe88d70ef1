"""One driver per study: a lock the database (or the SQLite file's folder) holds for the run.

The driver numbers and tells trials from its own copy of the study
(`trialq.driver._storage.mirror`), so a second `submit-study` on the same study would number
trials twice. It is refused with one line and exit 2 before it writes anything. The lock dies
with the driver's process or with its connection, so a crashed driver never blocks the next run:
- PostgreSQL: a session advisory lock, on a connection of its own that names the driver;
- MySQL: `GET_LOCK`, likewise;
- SQLite: an exclusive `flock` on a file beside the database, named after the study and
  removed when the run ends. It is taken before the database is opened (`holding_study_file`),
  so a second driver is refused before it creates anything: not a database beside one moved
  away under the first driver, nor Optuna's schema, which two drivers starting at once on a
  new file would both create (the loser failed on `alembic_version`);
- an in-memory database has one process by nature: no lock.
A restarted PostgreSQL forgets the lock with the connection; `ensure_held` takes it again
once the server is back (an error meanwhile is a storage outage, ridden out as any other),
and stops the run if another driver took it in between.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import sqlalchemy

from trialq.driver._storage.engine import lock_engine
from trialq.driver._storage.mirror import rdb_under
from trialq.errors import StudyInUse, UsageError

_ADVISORY_CLASS = 0x74716C6B  # "tqlk": trialq's class of PostgreSQL advisory locks
_IN_MEMORY = (None, "", ":memory:")


_END_OUR_STALE_SESSIONS = (
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE application_name = :me AND pid <> pg_backend_pid()"
)
"""A lock's connection name holds its host, pid and a token of its own: no other session
bears it."""


STALE_END_WAIT_S = 5.0
"""How long a lost session of this lock's own is waited for to end before the lock counts as
held by another driver."""


def _driver_name() -> str:
    return f"trialq-driver {socket.gethostname()} pid {os.getpid()}"


class StudyLock:
    """Held by the one driver of a study, from `acquire` to `release`."""

    def __init__(self, rdb: optuna.storages.RDBStorage, study_id: int, study_name: str) -> None:
        self._url = rdb.engine.url
        self._study_id = study_id
        self._study_name = study_name
        self._on_server = self._url.get_backend_name() in ("postgresql", "mysql", "mariadb")
        self._connection: sqlalchemy.Connection | None = None
        self._name = f"{_driver_name()} lock {secrets.token_hex(3)}"
        """The lock connection's `application_name`: this lock's alone, so a session bearing
        it that the server still holds is one this lock lost, never another's."""

    def acquire(self) -> None:
        """Take the server's lock, or raise `StudyInUse` naming who holds it (a SQLite study's
        lock is `holding_study_file`'s, taken before the database was opened)."""
        if self._on_server:
            self._take_on_server()

    def ensure_held(self) -> None:
        """Check the server still holds the lock for this driver; take it again after the
        server lost it (a restart). Raises the database's error while it is away."""
        if not self._on_server:
            return  # a file lock (SQLite's) cannot be lost
        if self._connection is None:
            self._take_on_server()
            return
        try:
            self._connection.execute(sqlalchemy.text("SELECT 1"))
        except sqlalchemy.exc.DBAPIError:
            self._drop_connection()  # taken again on the next call, once the server answers
            raise

    def release(self) -> None:
        """Let the next driver in."""
        self._drop_connection()

    def _take_on_server(self) -> None:
        engine = lock_engine(self._url, self._name)
        connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        if not self._take(connection):
            holder = connection.execute(self._statement("holder"), self._keys()).scalar()
            connection.close()
            raise StudyInUse.held_by(self._study_name, holder or "another driver")
        self._connection = connection

    def _take(self, connection: sqlalchemy.Connection) -> bool:
        """Take the lock; where the server still holds it for this very driver (a session it
        never heard close: the network dropped it silently, and the server's keepalive runs
        for hours), end that session of ours first and take it again."""
        if connection.execute(self._statement("take"), self._keys()).scalar():
            return True
        holder = connection.execute(self._statement("holder"), self._keys()).scalar()
        if holder != self._name or self._url.get_backend_name() != "postgresql":
            return False
        connection.execute(sqlalchemy.text(_END_OUR_STALE_SESSIONS), {"me": self._name})
        return self._take_once_ended(connection)

    def _take_once_ended(self, connection: sqlalchemy.Connection) -> bool:
        """The lost session ends a moment after it is told to (its backend exits on its
        own): take the lock as soon as it is free, `STALE_END_WAIT_S` at most."""
        deadline = time.monotonic() + STALE_END_WAIT_S
        while True:
            if connection.execute(self._statement("take"), self._keys()).scalar():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def _drop_connection(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
                self._connection.close()
            self._connection = None

    def _keys(self) -> dict[str, object]:
        return {"cls": _ADVISORY_CLASS, "study": self._study_id, "name": self._lock_name()}

    def _lock_name(self) -> str:
        return f"trialq-study-{self._study_id}"

    def _statement(self, what: str) -> sqlalchemy.TextClause:
        if self._url.get_backend_name() == "postgresql":
            sql = {
                "take": "SELECT pg_try_advisory_lock(:cls, :study)",
                "holder": "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = :cls AND l.objid = :study "  # advisory locks are per database
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            }
        else:
            sql = {
                "take": "SELECT GET_LOCK(:name, 0)",
                "holder": "SELECT CONCAT('connection ', IS_USED_LOCK(:name))",
            }
        return sqlalchemy.text(sql[what])


class _LockFile:
    """An exclusive `flock` on a file that says who holds it; the file goes with the lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def take(self, holder: str) -> str | None:
        """Take the lock and write `holder` into it; or return who holds it."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.read(fd, 200).decode(errors="replace").strip()
                os.close(fd)
                return text or "another driver"
            if self._is_current(fd):  # not a file its last holder removed meanwhile
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, holder.encode())
        self._fd = fd
        return None

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            os.close(self._fd)
            self._fd = None

    def _is_current(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False


@contextlib.contextmanager
def holding_study_file(url: str, study_name: str) -> Iterator[None]:
    """A SQLite study's lock, for as long as the block runs: taken before its database is
    opened or created. Nothing for another storage (its lock is `holding_study`'s)."""
    path = sqlite_lock_path(url, study_name)
    if path is None:
        yield
        return
    lock = _LockFile(path)
    try:
        holder = lock.take(_driver_name())
    except OSError as exc:  # no such folder, not writable: the database could not be either
        raise UsageError(f"cannot create the study's lock {path}: {exc.strerror}") from None
    if holder is not None:
        raise StudyInUse.held_by(study_name, holder)
    try:
        yield
    finally:
        lock.release()


def sqlite_lock_path(url: str, study_name: str) -> Path | None:
    """The lock file of study `study_name` beside its SQLite database, named after the study
    (a digest: any name makes a short, safe file name); None for another storage."""
    try:
        parsed = sqlalchemy.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return None  # no URL: opening the study says so
    if parsed.get_backend_name() != "sqlite" or parsed.database in _IN_MEMORY:
        return None
    digest = hashlib.sha256(study_name.encode()).hexdigest()[:16]
    return Path(f"{parsed.database}-driver-{digest}.lock")


@contextlib.contextmanager
def holding_study(study: optuna.Study) -> Iterator[StudyLock | None]:
    """The study's lock on its database server for as long as the block runs; None for a
    storage other than an RDB one (an in-memory study has one process by nature). A SQLite
    study's lock is taken before, by `holding_study_file`."""
    rdb = rdb_under(study._storage)
    if rdb is None:
        yield None
        return
    lock = StudyLock(rdb, study._study_id, study.study_name)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
