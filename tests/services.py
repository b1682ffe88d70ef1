"""Which Redis database and which PostgreSQL database this test process owns.

A plain run owns Redis database 15 (`TRIALQ_TEST_REDIS_URL` picks another) and the database
of `TRIALQ_TEST_POSTGRES_URL` (default `test`). Under pytest-xdist each worker owns one of
each: worker gwN takes the (N+1)-th Redis database counting up from 1 (or from the database
of `TRIALQ_TEST_REDIS_URL`), never one of `RESERVED`, and the PostgreSQL database
`<database>_<its Redis database>` on the same server, created on first use.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import sqlalchemy

RESERVED = {
    13: "benchmarks/naive_celery.py",
    14: "a second checkout's deploy tests (tests/deploy used database 14 before)",
    15: "a plain (not xdist) test run beside this one",
}
"""Redis databases an xdist worker never takes."""

REDIS_DATABASES = 16
"""Redis's default `databases`; a worker past the last one is an error, not a skip."""

PLAIN_REDIS_URL = "redis://127.0.0.1:6379/15"
FIRST_WORKER_DATABASE = 1


def xdist_worker_index() -> int | None:
    """0 for gw0, 1 for gw1, ...; None outside pytest-xdist (or in its controller)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return None if worker is None else int(worker.removeprefix("gw"))


def redis_database(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path else 0


def worker_redis_url(base: str | None, worker: int | None) -> str:
    """This process's Redis URL: `base` (or database 15) as is outside xdist; else the
    worker's own database on `base`'s server."""
    if worker is None:
        return base or PLAIN_REDIS_URL
    base = base or PLAIN_REDIS_URL.rsplit("/", 1)[0] + f"/{FIRST_WORKER_DATABASE}"
    free = (n for n in range(redis_database(base), REDIS_DATABASES) if n not in RESERVED)
    number = next((n for i, n in enumerate(free) if i == worker), None)
    if number is None:
        raise RuntimeError(
            f"pytest-xdist worker gw{worker} has no Redis database of its own below "
            f"{REDIS_DATABASES} from {base} (reserved: {sorted(RESERVED)}): use fewer workers"
        )
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{number}"))


def worker_postgres_url(base: str, redis_url: str, worker: int | None) -> str:
    """This process's PostgreSQL URL: `base` outside xdist; else a database of the worker's
    own on `base`'s server, named after the worker's Redis database."""
    if worker is None:
        return base
    url = sqlalchemy.make_url(base)
    name = f"{url.database}_{redis_database(redis_url)}"
    return url.set(database=name).render_as_string(hide_password=False)


def create_database_once(url: str, via: str) -> None:
    """Create `url`'s database unless it is there, connected to the database `via`."""
    target = sqlalchemy.make_url(url)
    admin = sqlalchemy.create_engine(via, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            exists = connection.execute(
                sqlalchemy.text("SELECT 1 FROM pg_database WHERE datname = :name"),
                {"name": target.database},
            ).first()
            if exists is None:
                connection.execute(sqlalchemy.text(f'CREATE DATABASE "{target.database}"'))
    finally:
        admin.dispose()


WORKER = xdist_worker_index()
TEST_REDIS_URL = worker_redis_url(os.environ.get("TRIALQ_TEST_REDIS_URL"), WORKER)
"""Tests own this database and flush only it."""

POSTGRES_SERVER_URL = os.environ.get(
    "TRIALQ_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
POSTGRES_URL = worker_postgres_url(POSTGRES_SERVER_URL, TEST_REDIS_URL, WORKER)
"""Tests make studies of their own names there and delete them."""
