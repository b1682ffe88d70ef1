"""A hung Redis does not stall training (issue 26.6): `trial.report()` and `should_prune()`
never wait on Redis, and every value reported reaches the stream once Redis answers again,
before the trial's result is returned."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis
from outage_proxy import OutageProxy
from trial_requests import trial_request

from trialq.gpu.device import FakeDevice
from trialq.trial.runner import run_trial
from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.keys import REPORTS
from trialq.wire.messages import Outcome

pytestmark = pytest.mark.integration

HANG_S = 8.0
"""How long Redis forwards nothing, from before the trial starts."""


@pytest.fixture
def proxy(redis_url: str) -> Iterator[OutageProxy]:
    target = urlsplit(redis_url)
    proxy = OutageProxy(target.port or 6379, target.hostname or "127.0.0.1")
    yield proxy
    proxy.close()


def test_reports_do_not_wait_on_a_hung_redis_and_all_arrive_once_it_answers(
    redis_url: str, proxy: OutageProxy
) -> None:
    database = urlsplit(redis_url).path
    # Celery's result-backend client, which the worker hands the trial, waits 120 s a reply.
    client = redis.Redis.from_url(f"redis://127.0.0.1:{proxy.port}{database}", socket_timeout=120)
    client.ping()
    proxy.hang()
    threading.Timer(HANG_S, proxy.restore).start()
    request = trial_request(study="hang", number=0, entrypoint="trials:reports_fifty")

    started = time.monotonic()
    result = run_trial(
        request, channel=ReportChannel(client), device=FakeDevice(), allowed_modules=("trials",)
    )
    returned_after = time.monotonic() - started

    assert result.outcome is Outcome.OK, result.error
    print(f"50 reports and prune checks with Redis hung: {result.metrics['loop_s']:.2f} s")
    assert result.metrics["loop_s"] < HANG_S / 4, result.metrics
    assert returned_after >= HANG_S - 1, "the result came before its reports were sent"
    direct = redis.Redis.from_url(redis_url)
    stream = direct.xrange(TrialAddress("hang", 0, 1).key(REPORTS))
    steps = [int(fields[b"step"]) for _id, fields in stream]
    assert steps == list(range(50)), steps
