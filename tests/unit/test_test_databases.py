"""The tests' own databases (tests/services.py): under pytest-xdist no two workers share a
Redis or a PostgreSQL database, and none takes one that something else on the machine uses."""

from __future__ import annotations

import pytest
from services import (
    RESERVED,
    TEST_REDIS_URL,
    WORKER,
    redis_database,
    worker_postgres_url,
    worker_redis_url,
)

PG = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


def test_a_plain_run_keeps_database_15_or_the_one_it_is_given() -> None:
    assert worker_redis_url(None, None) == "redis://127.0.0.1:6379/15"
    assert worker_redis_url("redis://10.0.0.2:6380/12", None) == "redis://10.0.0.2:6380/12"
    assert worker_postgres_url(PG, "redis://127.0.0.1:6379/15", None) == PG


def test_xdist_workers_count_up_from_1_past_the_reserved_databases() -> None:
    numbers = [redis_database(worker_redis_url(None, worker)) for worker in range(12)]
    assert numbers == list(range(1, 13))
    with pytest.raises(RuntimeError, match="gw12 has no Redis database of its own"):
        worker_redis_url(None, 12)
    assert {13, 14, 15} <= set(RESERVED)


def test_the_given_url_is_the_first_workers_database_on_its_server() -> None:
    base = "redis://:pw@10.0.0.2:6380/11"
    urls = [worker_redis_url(base, worker) for worker in range(2)]
    assert urls == ["redis://:pw@10.0.0.2:6380/11", "redis://:pw@10.0.0.2:6380/12"]
    with pytest.raises(RuntimeError, match="gw2"):  # 13, 14 and 15 are taken
        worker_redis_url(base, 2)


def test_each_worker_has_a_postgresql_database_named_after_its_redis_database() -> None:
    url = worker_postgres_url(PG, "redis://127.0.0.1:6379/3", 2)
    assert url == "postgresql+psycopg2://postgres@127.0.0.1:5432/test_3"


def test_this_process_uses_what_the_rules_give_it() -> None:
    if WORKER is not None:
        assert redis_database(TEST_REDIS_URL) not in RESERVED
