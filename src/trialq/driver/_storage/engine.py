"""How the driver reaches its database: every connection bounded in time, in one place.

A database that stops answering (a frozen server, a partition that drops packets without a
reset) must look like one that went away: an error within a bound, which the driver rides
out as an outage (`trialq.driver.outage`) and past `outage_limit_s` ends with exit 3. A
frozen server, or anything between that stops forwarding, still acknowledges TCP, so
keepalives and `tcp_user_timeout` never fire; only a bound kept by the client works:

- psycopg2 (`postgresql+psycopg2://`): a wait callback (`_wait_answered`) waits on the socket
  with `select`, at most `ANSWER_WITHIN_S` for each answer of a connect or a statement;
  silence that long closes the connection with an `OperationalError`. Its `select` also lets
  Ctrl-C through at once (psycopg2's own wait does not), without the cancel request that a
  hung server would never answer either.
- psycopg 3 (`postgresql://`, `postgresql+psycopg://`): connections of `_AnsweredConnection`,
  whose waits end after `ANSWER_WITHIN_S` a connect or a statement, and which closes
  itself on a timeout or Ctrl-C (psycopg's own Ctrl-C first sends a cancel, waiting 10 s).
- both: libpq's `connect_timeout`, keepalives on idle connections, `tcp_user_timeout` (data
  a silent partition leaves unacknowledged), and a pool that hands out a connection within
  the same bound. No server-side `statement_timeout` is set: PgBouncer refuses the startup
  option, and the client's bound ends a hung statement anyway.
"""

from __future__ import annotations

import select
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from sqlalchemy.pool import NullPool

from trialq.errors import StorageDeleted

ANSWER_WITHIN_S = 10.0
"""How long the database may leave a connect or a statement unanswered before it counts as
away. The driver's statements are small; a server that is up answers in milliseconds."""

KEEPALIVE = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5}
"""An idle connection to a host that vanished is found dead within about half a minute."""


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at `url`, its connections bounded in time; a SQLite file's
    errors said as its deletion once the file is gone (`_said_deleted`)."""
    rdb = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url))
    if _bound_psycopg3(rdb.engine) or _log_ahead_on_local_disk(rdb.engine):
        rdb.engine.dispose()  # the connection that checked the schema was made before
    _said_deleted(rdb.engine)
    return rdb


NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs", "ceph",
                       "glusterfs", "lustre", "gpfs", "beegfs", "fuse.")  # fmt: skip
"""Filesystem types (a prefix) where SQLite's WAL mode does not work: its shared memory is
one machine's (sqlite.org/wal.html, "WAL does not work over a network filesystem")."""


def _sqlite_file(engine: sqlalchemy.Engine) -> Path | None:
    """The file of a SQLite engine's database; None for another database, or one in memory."""
    database = engine.url.database
    if engine.url.get_backend_name() != "sqlite" or database in (None, "", ":memory:"):
        return None
    return Path(database)


def _log_ahead_on_local_disk(engine: sqlalchemy.Engine) -> bool:
    """A SQLite file on a local disk is written ahead to its log (`journal_mode=WAL`) and a
    commit waits for no fsync (`synchronous=NORMAL`): the commit before each suggested
    param's answer waited on SQLite's default fsyncs (16.3 ms a suggest under load, 1.1 ms
    after; docs/design.md, "Celery settings that carry the design"). A driver that crashes
    loses nothing committed; a power cut may lose the last commits, never the file. False
    for other databases, or a network disk."""
    path = _sqlite_file(engine)
    if path is None or filesystem_of(path).startswith(NETWORK_FILESYSTEMS):
        return False

    @sqlalchemy.event.listens_for(engine, "connect")
    def _log_ahead(connection: Any, record: Any) -> None:
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return True


def filesystem_of(path: Path, mounts: Path = Path("/proc/self/mounts")) -> str:
    """The type of the filesystem `path` is on, by the mount table; "" where none says."""
    try:
        table = mounts.read_text().splitlines()
    except OSError:  # no /proc (macOS): a laptop's disk, taken as local
        return ""
    where = str(path.resolve())
    best, kind = "", ""
    for line in table:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _said_deleted(engine: sqlalchemy.Engine) -> None:
    """On a SQLite file's engine, the file deleted, moved or replaced since it was opened
    raises `StorageDeleted`, at the next transaction or error: no outage, which the driver
    would wait on for a file that never comes back. (SQLite in its rollback mode refuses the
    writes, "attempt to write a readonly database"; in WAL mode it goes on writing its log
    beside the path, so the file's identity is checked as each transaction begins.)"""
    path = _sqlite_file(engine)
    if path is None:
        return
    opened = _identity(path)

    def gone() -> bool:
        return _identity(path) != opened

    def check(*_: Any) -> None:
        if gone():
            raise StorageDeleted.file(str(path))

    def handle_error(context: sqlalchemy.engine.ExceptionContext) -> None:
        if gone():
            raise StorageDeleted.file(str(path)) from context.original_exception

    sqlalchemy.event.listen(engine, "begin", check)
    sqlalchemy.event.listen(engine, "handle_error", handle_error)


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at `path` (device and inode), or None where there is none."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def lock_engine(url: sqlalchemy.URL, application_name: str) -> sqlalchemy.Engine:
    """An engine without a pool for the study lock's own connection, bounded as the rest."""
    kwargs = engine_kwargs(url)
    kwargs.pop("pool_timeout", None)
    if url.get_backend_name() == "postgresql":
        kwargs["connect_args"]["application_name"] = application_name
    engine = sqlalchemy.create_engine(url, poolclass=NullPool, **kwargs)
    _bound_psycopg3(engine)
    return engine


def engine_kwargs(url: str | sqlalchemy.URL) -> dict[str, Any]:
    """`create_engine` arguments that bound every wait on a PostgreSQL server; nothing extra
    for other databases."""
    parsed = sqlalchemy.make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return {}
    driver = parsed.get_driver_name()
    if driver == "psycopg2":
        _bound_psycopg2()
    connect_args: dict[str, Any] = {"connect_timeout": int(ANSWER_WITHIN_S), **KEEPALIVE}
    if _libpq_version(driver) >= 120000:
        connect_args["tcp_user_timeout"] = int(ANSWER_WITHIN_S * 1000)
    return {"connect_args": connect_args, "pool_timeout": ANSWER_WITHIN_S}


def _libpq_version(driver: str) -> int:
    """The libpq the driver runs on (tcp_user_timeout needs 12); 0 where it cannot say."""
    try:
        if driver == "psycopg2":
            import psycopg2  # type: ignore[import-untyped]

            return int(psycopg2.extensions.libpq_version())
        import psycopg

        return int(psycopg.pq.version())
    except ImportError:
        return 0


# --- psycopg2 ------------------------------------------------------------------------------


def _bound_psycopg2() -> None:
    """Every psycopg2 connection of this process waits through `_wait_answered`."""
    import psycopg2.extensions  # type: ignore[import-untyped]

    psycopg2.extensions.set_wait_callback(_wait_answered)


def _wait_answered(connection: Any) -> None:
    """psycopg2's wait for one connect or statement, answered within `ANSWER_WITHIN_S` each
    time it waits on the server, or the connection is closed with an `OperationalError`."""
    import psycopg2
    import psycopg2.extensions as ext

    while (state := connection.poll()) != ext.POLL_OK:
        socket = [connection.fileno()]
        reading, writing = (socket, []) if state == ext.POLL_READ else ([], socket)
        if not any(select.select(reading, writing, [], ANSWER_WITHIN_S)):
            raise psycopg2.OperationalError(
                f"the database has not answered for {ANSWER_WITHIN_S:g} s"
            )


# --- psycopg 3 -----------------------------------------------------------------------------


def _bound_psycopg3(engine: sqlalchemy.Engine) -> bool:
    """The engine's psycopg 3 connections from now on are `_AnsweredConnection`s; False for
    an engine of another driver."""
    if engine.dialect.driver != "psycopg":
        return False

    @sqlalchemy.event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, record: Any, cargs: Any, cparams: Any) -> Any:
        return _answered_connection_class().connect(*cargs, **cparams)

    return True


def _answered_connection_class() -> type[Any]:
    """psycopg 3's connection with every wait bounded; made when first asked for (psycopg 3
    is only imported where a URL names it)."""
    global _ANSWERED
    if _ANSWERED is None:
        import psycopg
        from psycopg import waiting

        bounded = psycopg_waits_are_bounded()

        class _AnsweredConnection(psycopg.Connection[Any]):
            """Waits at most `ANSWER_WITHIN_S` for an operation; closed on a timeout or
            Ctrl-C, so no cancel request waits on a server that does not answer."""

            def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
                bound = {"timeout": timeout or ANSWER_WITHIN_S} if bounded else {}
                try:
                    return waiting.wait(gen, self.pgconn.socket, interval=interval, **bound)
                except (psycopg.OperationalError, KeyboardInterrupt):
                    self.pgconn.finish()
                    raise

        _ANSWERED = _AnsweredConnection
    return _ANSWERED


_ANSWERED: type[Any] | None = None


def psycopg_waits_are_bounded() -> bool:
    """Whether the installed psycopg 3's wait takes a timeout (3.3.x's does, 3.2's does not:
    there a hung server is waited for as psycopg waits, without trialq's bound)."""
    import inspect

    from psycopg import waiting

    return "timeout" in inspect.signature(waiting.wait).parameters
