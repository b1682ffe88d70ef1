"""Fixtures the fault tests share: a driver run on the test broker, and PostgreSQL behind a
proxy that can cut or hang it with a driver run whose study lives there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
from outage_proxy import OutageProxy

from faults.harness import DriverRun, delete_study


@pytest.fixture
def run(tmp_path: Path, redis_url: str) -> DriverRun:
    """A study folder and the counting driver on the test broker (its study in SQLite)."""
    return DriverRun(tmp_path, redis_url)


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[OutageProxy]:
    """The machine's PostgreSQL behind a proxy that can cut it off or hang it."""
    proxy = OutageProxy(sqlalchemy.make_url(postgres_url).port or 5432)
    yield proxy
    proxy.close()


@pytest.fixture
def run_via_proxy(
    tmp_path: Path, redis_url: str, postgres_url: str, proxy: OutageProxy
) -> Iterator[DriverRun]:
    """A driver run whose study is in PostgreSQL through `proxy`; none left before or after."""
    url = sqlalchemy.make_url(postgres_url).set(port=proxy.port)
    run = DriverRun(tmp_path, redis_url, storage_url=url.render_as_string(hide_password=False))
    delete_study(run)
    yield run
    proxy.restore()
    delete_study(run)
