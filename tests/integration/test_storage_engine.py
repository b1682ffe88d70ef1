"""The driver's database connections are bounded in time (issue 26, item 5): a server that
stops answering is an `OperationalError` within `ANSWER_WITHIN_S`, for psycopg2 and psycopg 3
alike, and the connection is not used again."""

from __future__ import annotations

import time
from collections.abc import Iterator

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
