"""The driver's database connections are bounded in time (issue 26, item 5): a server that
stops answering is an `OperationalError` within `ANSWER_WITHIN_S`, for psycopg2 and psycopg 3
alike, and the connection is not used again. A SQLite file on a local disk commits to its
write-ahead log without an fsync; on a network disk it keeps SQLite's defaults."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from outage_proxy import OutageProxy

from trialq.driver._storage import engine

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[OutageProxy]:
    proxy = OutageProxy(sqlalchemy.make_url(postgres_url).port or 5432)
    yield proxy
    proxy.close()


@pytest.mark.parametrize("driver", ["psycopg2", "psycopg"])
def test_a_hung_server_is_an_error_within_the_bound(
    postgres_url: str, proxy: OutageProxy, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if driver == "psycopg" and not engine.psycopg_waits_are_bounded():
        pytest.skip("this psycopg's wait takes no timeout (3.2): no bound to test")
    monkeypatch.setattr(engine, "ANSWER_WITHIN_S", 1.0)
    url = sqlalchemy.make_url(postgres_url).set(drivername=f"postgresql+{driver}", port=proxy.port)
    rdb = engine.rdb_storage(url.render_as_string(hide_password=False))
    with rdb.engine.connect() as connection:
        connection.execute(sqlalchemy.text("SELECT 1"))
        proxy.hang()
        started = time.monotonic()
        with pytest.raises(sqlalchemy.exc.OperationalError):
            connection.execute(sqlalchemy.text("SELECT 2"))
    # Bounded near the 1 s set (the default is 10 s), with room for a loaded host.
    assert time.monotonic() - started < 5.0
    started = time.monotonic()
    with pytest.raises(sqlalchemy.exc.OperationalError):
        rdb.engine.connect()  # a new connection waits no longer (libpq's own floor is 2 s)
    assert time.monotonic() - started < 6.0
    proxy.restore()
    with rdb.engine.connect() as connection:
        assert connection.execute(sqlalchemy.text("SELECT 3")).scalar_one() == 3
    rdb.engine.dispose()


def _journal(rdb: optuna.storages.RDBStorage) -> tuple[str, int]:
    with rdb.engine.connect() as connection:
        mode = connection.execute(sqlalchemy.text("PRAGMA journal_mode")).scalar_one()
        sync = connection.execute(sqlalchemy.text("PRAGMA synchronous")).scalar_one()
    return str(mode), int(sync)


def test_a_sqlite_file_on_a_local_disk_commits_to_its_log_without_fsync(tmp_path: Path) -> None:
    rdb = engine.rdb_storage(f"sqlite:///{tmp_path / 'study.db'}")
    assert _journal(rdb) == ("wal", 1)  # 1: NORMAL
    study = optuna.create_study(storage=rdb, study_name="s")
    study.enqueue_trial({"x": 1.0})
    other = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'study.db'}")
    assert len(other.trials) == 1  # another process's Optuna reads what was committed


def test_a_sqlite_file_on_a_network_disk_keeps_sqlites_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "filesystem_of", lambda path: "nfs4")
    rdb = engine.rdb_storage(f"sqlite:///{tmp_path / 'study.db'}")
    assert _journal(rdb) == ("delete", 2)  # 2: FULL


def test_the_filesystem_of_a_path_is_its_longest_mount_point(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        "server:/export /mnt/shared nfs4 rw 0 0\n"
        "sshfs#me@h: /mnt/shared/my\\040box fuse.sshfs rw 0 0\n"
    )
    assert engine.filesystem_of(Path("/home/me/study.db"), mounts) == "ext4"
    assert engine.filesystem_of(Path("/mnt/shared/a/study.db"), mounts) == "nfs4"
    assert engine.filesystem_of(Path("/mnt/shared/my box/study.db"), mounts) == "fuse.sshfs"
    assert engine.filesystem_of(Path("/mnt/sharedx/study.db"), mounts) == "ext4"
    assert engine.filesystem_of(Path("/x"), tmp_path / "absent") == ""
