"""trialq across test hosts: Redis, PostgreSQL, the driver and the workers each on a host of
its own (`netns.Host`), all reached from the test process through the observer's link."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import redis
import sqlalchemy
from faults.harness import TESTS_DIR, DriverRun
from waiting import wait_for_redis, wait_until

from hosts.netns import Host
from trialq.local import LocalCluster
from trialq.wire import heartbeat

REDIS_PORT = 6379
POSTGRES_PORT = 5432
POSTGRES_USER = "postgres"
"""The system account PostgreSQL runs as (it refuses root), and its superuser's name."""


def postgres_binaries() -> Path | None:
    """The newest installed PostgreSQL's bin folder holding initdb, if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(path: str) -> int:
    part = Path(path).parents[1].name
    return int(part) if part.isdigit() else 0


def _as_postgres(*argv: str) -> list[str]:
    return ["setpriv", f"--reuid={POSTGRES_USER}", f"--regid={POSTGRES_USER}", "--init-groups",
            *argv]  # fmt: skip


class RedisHost:
    """A Redis server of the tests' own on its host, AOF on so that a restart keeps the queue."""

    def __init__(self, host: Host, folder: Path) -> None:
        self.host = host
        self.folder = folder
        self.url = f"redis://{host.ip}:{REDIS_PORT}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.client = redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)

    def start(self) -> None:
        argv = [
            shutil.which("redis-server") or "redis-server",
            "--bind", self.host.ip, "--port", str(REDIS_PORT), "--protected-mode", "no",
            "--save", "", "--appendonly", "yes", "--appendfsync", "always",
            "--dir", str(self.folder),
        ]  # fmt: skip
        self.process = self.host.spawn(argv, self.folder / "redis.log")
        wait_for_redis(self.client, 30)

    def stop(self) -> None:
        """SIGTERM: Redis writes what it holds and exits, as a restart of its service does."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class PostgresHost:
    """A PostgreSQL server of the tests' own on its host (initdb into a temporary folder)."""

    def __init__(self, host: Host, binaries: Path) -> None:
        self.host = host
        self.binaries = binaries
        self.folder = Path(tempfile.mkdtemp(prefix="trialq-hosts-pg-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._databases = 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://{POSTGRES_USER}@{self.host.ip}:{POSTGRES_PORT}/{database}"

    def start(self) -> None:
        data = self.folder / "data"
        shutil.chown(self.folder, POSTGRES_USER, POSTGRES_USER)
        subprocess.run(
            _as_postgres(str(self.binaries / "initdb"), "-D", str(data), "-A", "trust",
                         "-U", POSTGRES_USER, "--no-sync", "-E", "UTF8"),
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        with (data / "pg_hba.conf").open("a") as hba:  # the hosts' link only, no password
            hba.write(f"host all all {self.host.ip.rsplit('.', 1)[0]}.0/24 trust\n")
        argv = _as_postgres(
            str(self.binaries / "postgres"), "-D", str(data), "-k", str(self.folder),
            "-h", self.host.ip, "-p", str(POSTGRES_PORT),
            "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=60", "-c", "shared_buffers=32MB",
        )  # fmt: skip
        self.process = self.host.spawn(argv, self.folder / "postgres.log")
        wait_until(self._answers, 60, lambda: f"PostgreSQL to answer: {self._log_tail()}", 0.2)

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"PostgreSQL exited: {self._log_tail()}")
        engine = sqlalchemy.create_engine(self.url(), connect_args={"connect_timeout": 2})
        try:
            engine.connect().close()
            return True
        except sqlalchemy.exc.OperationalError:
            return False
        finally:
            engine.dispose()

    def _log_tail(self) -> str:
        log = self.folder / "postgres.log"
        return log.read_text(errors="replace")[-500:] if log.exists() else "(no log)"

    def new_database(self) -> str:
        """A fresh database for one test; its URL."""
        self._databases += 1
        name = f"study_{self._databases}"
        admin = sqlalchemy.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as connection:
                connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        finally:
            admin.dispose()
        return self.url(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then the folder goes."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class HostWorkers(LocalCluster):
    """`trialq worker` processes started on a host: LocalCluster's, with its broker given,
    each command run in the host's namespaces (the workers' names end in `@<role>`)."""

    def __init__(
        self, host: Host, broker_url: str, log_dir: Path, count: int, env: dict[str, str]
    ) -> None:
        self.host = host
        path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
        super().__init__(
            count, "gpu", allowed_modules=("trials",), extra_env={"PYTHONPATH": path, **env},
            broker_url=broker_url, log_dir=log_dir,
            # The driver on its own host signs with the suite's secret (tests/conftest.py).
            result_secret=os.environ["TRIALQ_RESULT_SECRET"],
        )  # fmt: skip

    def _spawn(
        self, command: list[str], log_name: str, when_orphaned: signal.Signals
    ) -> subprocess.Popen[bytes]:
        return super()._spawn(self.host.command(*command), log_name, when_orphaned)

    def names(self, client: redis.Redis) -> list[str]:
        return [
            b.name for b in heartbeat.live_workers(client) if b.name.endswith(f"@{self.host.role}")
        ]


@dataclass
class HostDriverRun(DriverRun):
    """`submit-study` (counting tells) run on the driver's host."""

    host: Host | None = None

    def start(self, *extra: str) -> subprocess.Popen[str]:
        assert self.host is not None
        env = {
            **os.environ,
            "TRIALQ_TEST_TELL_LOG": str(self.tell_log),
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        }
        command = self.host.command(
            sys.executable, "-m", "faults.counting_driver", str(self.folder / "study.toml"),
            "--broker", self.broker_url, "--storage", self.storage, "--no-progress", *extra,
        )  # fmt: skip
        return subprocess.Popen(
            command, env=env, cwd=self.folder, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
