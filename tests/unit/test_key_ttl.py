"""How long Redis keeps what each trial leaves behind is one setting, `TRIALQ_KEY_TTL_S`
(issue 26.13): the trial's result (trialq's key and Celery's meta) and the withdrawn mark."""

from __future__ import annotations

import pytest
import redis
from trial_requests import trial_request

from trialq._celery.app import celery_config
from trialq._celery.dispatcher import CeleryDispatcher
from trialq.settings import Settings
from trialq.wire.keys import result_key, withdrawn_key
from trialq.worker.result_store import ResultStore


class RecordingRedis:
    """Keeps each `set`'s expiry."""

    def __init__(self) -> None:
        self.expiries: dict[str, int] = {}

    def set(self, key: str, value: str, ex: int) -> None:
        self.expiries[key] = ex

    def publish(self, channel: str, message: str) -> None:
        pass


def test_the_setting_is_read_from_the_environment_and_a_week_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().key_ttl_s == 7 * 24 * 3600
    monkeypatch.setenv("TRIALQ_KEY_TTL_S", "90")
    assert Settings().key_ttl_s == 90
    assert celery_config(Settings())["result_expires"] == 90, "Celery's result meta"


def test_a_worker_keeps_a_trial_s_result_for_the_setting_s_time() -> None:
    settings = Settings(broker_url="redis://127.0.0.1:1/0", key_ttl_s=90)
    client = RecordingRedis()
    store = ResultStore(lambda: client, settings.key_ttl_s, settings.max_result_bytes)  # type: ignore[arg-type, return-value]
    store.retry_delays_s = (0.0,)
    store.keep(trial_request(), "task-1", '{"outcome": "ok"}')
    assert client.expiries == {result_key("task-1"): 90}


def test_the_driver_marks_a_task_withdrawn_for_the_setting_s_time(redis_url: str) -> None:
    settings = Settings(broker_url=redis_url, key_ttl_s=90)
    CeleryDispatcher(settings).withdraw(["task-1"], "gpu")
    CeleryDispatcher(settings).terminate("task-2")
    client = redis.Redis.from_url(redis_url)
    for task_id in ("task-1", "task-2"):
        assert 85_000 < client.pttl(withdrawn_key(task_id)) <= 90_000
