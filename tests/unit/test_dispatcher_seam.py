"""The dispatcher seam speaks trialq's errors, reads each beacon with its status, and keeps
the report channel's keys for `TRIALQ_KEY_TTL_S`: on the real Redis, and on a port where none
answers."""

from __future__ import annotations

import pytest
import redis

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.errors import BrokerError, BrokerUnreachable
from trialq.settings import Settings
from trialq.wire.channel import TrialAddress
from trialq.wire.dispatch import TaskPhase
from trialq.wire.keys import PRUNE, attempt_key, kombu_queue_key

NOBODY = "redis://127.0.0.1:1/0"
"""A port where no Redis answers."""
ADDRESS = TrialAddress("seam", 3, 1)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: d.statuses(["task-1"]),
        lambda d: d.pending_ids("gpu"),
        lambda d: d.worker_alive("w@host"),
        lambda d: d.attempt_alive("task-1"),
        lambda d: d.withdraw(["task-1"], "gpu"),
        lambda d: d.live_worker_count("gpu"),
        lambda d: d.reports().read_new({ADDRESS: "0"}),
        lambda d: d.reports().forget(ADDRESS),
    ],
    ids=["statuses", "pending_ids", "worker_alive", "attempt_alive", "withdraw",
         "live_worker_count", "reports.read_new", "reports.forget"],
)  # fmt: skip
def test_a_broker_away_is_broker_unreachable_never_a_redis_error(call: object) -> None:
    dispatcher = CeleryDispatcher(Settings(broker_url=NOBODY))

    with pytest.raises(BrokerUnreachable) as raised:
        call(dispatcher)  # type: ignore[operator]

    assert isinstance(raised.value.__cause__, redis.ConnectionError), "the cause is kept"
    assert str(raised.value).startswith("broker unreachable: ")


def test_a_refusal_that_is_no_outage_is_a_broker_error(redis_url: str) -> None:
    """A queue key of the wrong type: Redis answers WRONGTYPE, a refusal, not an outage."""
    redis.Redis.from_url(redis_url).set(kombu_queue_key("gpu"), "not a list")
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))

    with pytest.raises(BrokerError) as raised:
        dispatcher.pending_ids("gpu")

    assert not isinstance(raised.value, BrokerUnreachable)
    assert isinstance(raised.value.__cause__, redis.ResponseError)


def test_each_status_carries_its_attempts_beacon_read_in_the_same_round_trip(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(attempt_key("beating"), "{}")
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))

    statuses = dispatcher.statuses(["beating", "silent"])

    assert statuses["beating"].beating is True and statuses["silent"].beating is False
    assert statuses["beating"].phase is TaskPhase.WAITING
    client.delete(attempt_key("beating"))
    assert dispatcher.attempt_alive("beating") is False, "asked now, not remembered"


def test_the_report_channel_keeps_its_keys_for_the_one_ttl_setting(redis_url: str) -> None:
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url, key_ttl_s=90))
    reports = dispatcher.reports()

    reports.request_prune(ADDRESS)
    client = redis.Redis.from_url(redis_url)

    assert 85_000 < client.pttl(ADDRESS.key(PRUNE)) <= 90_000
