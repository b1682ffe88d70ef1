"""The worker's state on one object, built from the settings it is given; Celery's signals
reach it through one handler each, which runs its steps in a stated order."""

from __future__ import annotations

import logging
import weakref
from typing import Any

import pytest
import redis
from celery import signals
from trial_requests import trial_request

from trialq._celery import worker as worker_module
from trialq._celery.worker import WorkerState
from trialq.settings import Settings
from trialq.wire.keys import result_key, results_channel

REQUEST = trial_request(study="digits", number=7, attempt=2, params={"x": 0.5})


class FlakyRedis:
    """Refuses the first `failures` writes, as a Redis that is restarting does."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.stored: dict[str, str] = {}
        self.published: list[tuple[str, str]] = []

    def set(self, key: str, value: str, ex: int) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise redis.ConnectionError("Connection refused")
        self.stored[key] = value

    def publish(self, channel: str, message: str) -> None:
        self.published.append((channel, message))


def _state(client: FlakyRedis) -> WorkerState:
    state = WorkerState(Settings(broker_url="redis://127.0.0.1:1/0"))
    state.result_retry_delays_s = (0.0, 0.0, 0.0)
    state._redis = client  # type: ignore[assignment]
    return state


def test_a_result_is_stored_once_redis_is_back(caplog: pytest.LogCaptureFixture) -> None:
    client = FlakyRedis(failures=2)
    _state(client).keep_result(REQUEST, "task-1", '{"outcome": "ok"}')
    assert client.stored == {result_key("task-1"): '{"outcome": "ok"}'}
    assert client.published == [(results_channel("digits"), "task-1")], "a driver waits on it"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_giving_up_on_a_result_is_an_error_naming_the_trial_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FlakyRedis(failures=3)
    with caplog.at_level(logging.ERROR, logger="trialq.worker"):
        _state(client).keep_result(REQUEST, "task-1", '{"outcome": "ok"}')
    assert client.stored == {}
    assert client.published == [], "nothing stored, nothing announced"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, "gave up on a trial's result without an error line"
    line = errors[0].getMessage()
    for part in ("trial 7", "'digits'", "attempt 2", "task-1", "3 tries", "Connection refused"):
        assert part in line, line


def test_the_state_is_built_from_the_settings_it_is_given() -> None:
    settings = Settings(broker_url="redis://127.0.0.1:1/3", cuda_visible_devices="1")
    state = WorkerState(settings)
    assert state.settings is settings
    assert state.app.conf.broker_url == "redis://127.0.0.1:1/3"
    assert state.baseline is None and state.heartbeat is None


def test_one_handler_per_signal_runs_the_worker_s_steps_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps: list[str] = []
    for name in ("preload", "measure_device_baseline", "start_heartbeat"):
        monkeypatch.setattr(worker_module.worker, name, lambda *_a, _n=name, **_k: steps.append(_n))
    monkeypatch.setattr(worker_module, "_freeze_started_worker", lambda: steps.append("freeze"))
    signals.worker_init.send(sender=None)
    signals.worker_ready.send(sender=None)
    assert steps == ["preload", "measure_device_baseline", "freeze", "start_heartbeat"]


@pytest.mark.parametrize(
    "signal",
    [
        signals.after_setup_logger,
        signals.worker_init,
        signals.worker_before_create_process,
        signals.worker_process_init,
        signals.worker_ready,
        signals.task_prerun,
        signals.task_postrun,
        signals.worker_shutting_down,
        signals.worker_shutdown,
    ],
)
def test_trialq_connects_one_handler_to_each_signal(signal: Any) -> None:
    ours = [
        receiver
        for _key, receiver in signal.receivers
        if getattr(_live(receiver), "__module__", "") == worker_module.__name__
    ]
    assert len(ours) == 1, ours


def _live(receiver: Any) -> Any:
    """The function Celery keeps a (weak) reference to."""
    return receiver() if isinstance(receiver, weakref.ReferenceType) else receiver
