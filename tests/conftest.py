"""Shared fixtures: the machine's real Redis (one dedicated database), its real PostgreSQL,
and real workers."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy

from trialq.local import LocalCluster

TEST_REDIS_URL = os.environ.get("TRIALQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
"""Tests own this database and flush only it."""

POSTGRES_URL = os.environ.get(
    "TRIALQ_TEST_POSTGRES_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
)
"""Tests make studies of their own names there and delete them."""

TESTS_DIR = Path(__file__).parent


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A clean, dedicated Redis database; skipped locally, failed in CI, if Redis is away."""
    client = redis.Redis.from_url(TEST_REDIS_URL, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {TEST_REDIS_URL} is required in CI: {exc}")
        pytest.skip(f"Redis at {TEST_REDIS_URL} is not answering: {exc}")
    client.flushdb()
    yield TEST_REDIS_URL
    client.flushdb()


@pytest.fixture
def postgres_url() -> str:
    """The machine's PostgreSQL; skipped locally, failed in CI, if it is not answering."""
    try:
        sqlalchemy.create_engine(POSTGRES_URL).connect().close()
    except sqlalchemy.exc.OperationalError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {POSTGRES_URL} is required in CI: {exc}")
        pytest.skip(f"PostgreSQL is not answering: {exc}")
    return POSTGRES_URL


@pytest.fixture
def start_workers(redis_url: str) -> Iterator[Callable[..., LocalCluster]]:
    """Start N real `trialq worker` processes on the test database; stopped afterwards."""
    clusters: list[LocalCluster] = []

    def start(
        count: int = 2,
        queue: str = "gpu",
        extra_env: dict[str, str] | None = None,
        broker_url: str | None = None,
    ) -> LocalCluster:
        env = {"PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
        cluster = LocalCluster(
            count,
            queue,
            allowed_modules=("trials", "trialq.examples"),
            extra_env={**env, **(extra_env or {})},
            broker_url=broker_url or redis_url,
        )
        clusters.append(cluster.__enter__())
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """Write a spec file into tmp_path from TOML text (dedented)."""

    def write(text: str, name: str = "study.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TRIALQ_* variable of the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("TRIALQ_") and name != "TRIALQ_TEST_REDIS_URL":
            monkeypatch.delenv(name)
