"""Riding out a lost broker or storage: which errors are outages, the backoff, the limit.

The errors are the real ones: raised by SQLAlchemy against a port nothing listens on, and
wrapped as Optuna and trialq wrap them. The clock and the sleep are the test's, so the limit
is reached without waiting for it."""

from __future__ import annotations

import optuna
import pytest
import redis
import sqlalchemy

from trialq.driver.outage import LONGEST_RETRY_S, SETTLED_S, Outages, service_lost
from trialq.errors import BrokerUnreachable, StorageUnreachable
from trialq.local import free_port


def _refused_by_postgresql() -> sqlalchemy.exc.OperationalError:
    engine = sqlalchemy.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/x")
    try:
        engine.connect()
    except sqlalchemy.exc.OperationalError as exc:
        return exc
    raise AssertionError("nothing should listen there")


def _wrapped_as_optuna_does(cause: BaseException) -> optuna.exceptions.StorageInternalError:
    try:
        raise optuna.exceptions.StorageInternalError("writing trial data failed") from cause
    except optuna.exceptions.StorageInternalError as exc:
        return exc


def test_lost_services_are_told_apart_from_bugs() -> None:
    refused = _refused_by_postgresql()
    assert service_lost(refused) == "storage"
    assert service_lost(_wrapped_as_optuna_does(refused)) == "storage"
    away = BrokerUnreachable("broker unreachable: Connection refused")
    assert service_lost(away) == "broker"
    # Redis's own errors are the dispatcher's to translate (test_dispatcher_seam.py): one
    # that got past it would be a bug of the seam, not an outage to wait out.
    assert service_lost(redis.ConnectionError("refused")) is None
    bad_sql = sqlalchemy.exc.ProgrammingError("SELECT nonsense", {}, Exception("syntax"))
    assert service_lost(_wrapped_as_optuna_does(bad_sql)) is None
    assert service_lost(ValueError("a bug")) is None


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_storage_outage_is_retried_with_backoff_then_given_up_with_exit_3() -> None:
    clock = _Clock()
    outages = Outages(limit_s=30, clock=clock, sleep=clock.sleep)
    lost = _wrapped_as_optuna_does(_refused_by_postgresql())
    with pytest.raises(StorageUnreachable) as given_up:
        while True:
            with outages.tolerated():
                raise lost
    assert given_up.value.exit_code == 3
    assert "storage unreachable for 30 s" in str(given_up.value)
    assert clock.sleeps[:4] == [0.5, 1.0, 2.0, 4.0] and max(clock.sleeps) == LONGEST_RETRY_S
    assert 30 < clock.now <= 30 + LONGEST_RETRY_S


def test_the_storage_is_back_only_once_it_answers() -> None:
    clock = _Clock()
    outages = Outages(limit_s=10, clock=clock, sleep=clock.sleep)
    with outages.tolerated():
        raise _refused_by_postgresql()
    with outages.tolerated():
        pass  # a pass that asked nothing of the storage
    assert outages.away("storage")
    outages.recovered("storage")
    assert not outages.away("storage")
    clock.now += 60  # a new outage starts its own count
    with outages.tolerated():
        raise _refused_by_postgresql()
    assert outages.away("storage")


def test_the_broker_is_back_after_a_clean_pass_and_bugs_go_through() -> None:
    clock = _Clock()
    outages = Outages(limit_s=10, clock=clock, sleep=clock.sleep)
    with outages.tolerated():
        raise BrokerUnreachable("no Redis")
    assert outages.away("broker")
    with outages.tolerated():
        pass
    assert not outages.away("broker")
    with pytest.raises(KeyError), outages.tolerated():
        raise KeyError("a bug is no outage")


def test_an_outage_that_comes_and_goes_is_said_once_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full Redis answers reads: passes that only read go through between those that
    write, and an 8 s outage was said "unreachable" and "back" five times each."""
    clock = _Clock()
    outages = Outages(limit_s=60, clock=clock, sleep=clock.sleep)
    while clock.now < 8:  # a pass that writes is refused, the next only reads
        with outages.tolerated():
            raise BrokerUnreachable("OOM command not allowed when used memory > 'maxmemory'")
        with outages.tolerated():
            clock.now += 0.5
    outage_ended = clock.now
    while clock.now < outage_ended + SETTLED_S:
        with outages.tolerated():
            clock.now += 1.0

    lines = [r.getMessage() for r in caplog.records if r.name == "trialq.outage"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("broker unreachable (")
    assert lines[1].startswith("broker back after ") and lines[1].endswith(" s"), lines
    assert 7.0 <= float(lines[1].split()[3]) <= outage_ended, "not the outage's length"


def test_a_service_back_as_the_run_ends_is_said_back(caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    outages = Outages(limit_s=60, clock=clock, sleep=clock.sleep)
    with outages.tolerated():
        raise BrokerUnreachable("no Redis")
    with outages.tolerated():
        pass
    assert not any("back" in r.getMessage() for r in caplog.records)
    outages.settled()
    assert [r.getMessage() for r in caplog.records][-1] == "broker back after 0.5 s"
