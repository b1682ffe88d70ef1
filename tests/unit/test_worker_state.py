"""The worker's parent has a room of its own (`trialq.worker`): its state on one object built
from the settings it is handed, no Celery in it, carried by the app that runs it, and one
bootstep that calls its steps, each start beside its stop. The trial process's result is
kept by the trial wing (`trialq.worker.result_store`)."""

from __future__ import annotations

import logging
import subprocess
import sys
import types
import weakref
from typing import Any

import pytest
import redis
from celery import signals
from trial_requests import trial_request

from trialq._celery import lifecycle
from trialq._celery.lifecycle import WorkerLifecycle, worker_of
from trialq._celery.worker import build_worker_app
from trialq.settings import Settings
from trialq.wire.keys import result_key, results_channel
from trialq.worker.result_store import ResultStore
from trialq.worker.state import WorkerState

REQUEST = trial_request(study="digits", number=7, attempt=2, params={"x": 0.5})
NOWHERE = "redis://127.0.0.1:1/0"


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


def _store(client: FlakyRedis) -> ResultStore:
    store = ResultStore(lambda: client, key_ttl_s=60, max_result_bytes=1000)  # type: ignore[arg-type, return-value]
    store.retry_delays_s = (0.0, 0.0, 0.0)
    return store


def test_a_result_is_stored_once_redis_is_back(caplog: pytest.LogCaptureFixture) -> None:
    client = FlakyRedis(failures=2)
    _store(client).keep(REQUEST, "task-1", '{"outcome": "ok"}')
    assert client.stored == {result_key("task-1"): '{"outcome": "ok"}'}
    assert client.published == [(results_channel("digits"), "task-1")], "a driver waits on it"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_giving_up_on_a_result_is_an_error_naming_the_trial_and_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FlakyRedis(failures=3)
    with caplog.at_level(logging.ERROR, logger="trialq.worker"):
        _store(client).keep(REQUEST, "task-1", '{"outcome": "ok"}')
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
    assert state.baseline is None and state.heartbeat is None and state.slots is None
    app = build_worker_app(state)
    assert app.conf.broker_url == "redis://127.0.0.1:1/3", "the app is the state's settings'"
    worker = worker_of(app)
    assert worker is not None and worker.state is state, "the app carries the worker it runs"
    import trialq.worker

    assert trialq.worker.app is app, "`celery -A trialq.worker` names the app built here"
    child = worker.child()
    assert child.settings is settings and child.results.key_ttl_s == settings.key_ttl_s
    assert worker.child() is child, "one per trial process"
    assert worker_of(types.SimpleNamespace()) is None, "an app that runs no trialq worker"


def test_the_worker_room_imports_no_celery_and_builds_nothing_at_import() -> None:
    """Importing the room reads no settings and starts no Celery; `celery -A trialq.worker`
    still finds the app, built then."""
    code = (
        "import sys, trialq.worker, trialq.worker.state\n"
        "assert 'celery' not in sys.modules, 'the room imported Celery'\n"
        "from celery.app.utils import find_app\n"
        "app = find_app('trialq.worker')\n"
        "assert 'trialq.run_trial' in app.tasks, sorted(app.tasks)\n"
        "assert find_app('trialq.worker') is app, 'built once'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


class _Consumer(types.SimpleNamespace):
    """What the bootstep reads of Celery's consumer; hashable, as a signal's sender is."""

    __hash__ = object.__hash__


def _consumer(app: Any) -> _Consumer:
    queues = types.SimpleNamespace(consume_from={"b": 1, "a": 2})
    return _Consumer(
        hostname="w@h",
        app=types.SimpleNamespace(
            amqp=types.SimpleNamespace(queues=queues), trialq_worker=worker_of(app)
        ),
        pool=types.SimpleNamespace(num_processes=3),
        controller=types.SimpleNamespace(concurrency=3),
    )


LIFECYCLE_SIGNALS = (
    signals.worker_before_create_process,
    signals.worker_process_init,
    signals.task_prerun,
    signals.task_postrun,
    signals.worker_shutting_down,
)


def _trialq_receivers(signal: Any) -> list[Any]:
    return [
        live
        for _key, receiver in signal.receivers
        if (live := _live(receiver)) is not None
        and getattr(live, "__module__", "").startswith("trialq.")
    ]


def _live(receiver: Any) -> Any:
    """The function Celery keeps a (weak) reference to."""
    return receiver() if isinstance(receiver, weakref.ReferenceType) else receiver


def test_the_bootstep_runs_each_start_beside_its_stop_in_the_worker_s_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prepared before the pool forks, beating once it consumes (once, through a lost
    connection), preempting on SIGTERM only while it runs, stopped once the pool stopped;
    its handlers connected only while their moment lasts."""
    state = WorkerState(Settings(broker_url=NOWHERE))
    app = build_worker_app(state)
    assert WorkerLifecycle in app.steps["consumer"], "registered on the consumer's blueprint"
    steps: list[Any] = []
    for name in ("preload", "plan_gpus", "probe_gpus", "measure_device_baseline"):
        monkeypatch.setattr(state, name, lambda *_a, _n=name, **_k: steps.append(_n))
    monkeypatch.setattr(lifecycle, "_freeze_started_worker", lambda: steps.append("freeze"))
    monkeypatch.setattr(state, "start_heartbeat", lambda *args: steps.append(args))
    monkeypatch.setattr(state, "stop_heartbeat", lambda: steps.append("stop heartbeat"))
    monkeypatch.setattr(state, "preempt", lambda running: steps.append(("preempt", running)))
    consumer = _consumer(app)
    step = WorkerLifecycle(consumer)
    assert not any(_trialq_receivers(s) for s in LIFECYCLE_SIGNALS), "connected before create"

    try:
        _live_through(step, consumer, state, steps)
    finally:
        step.shutdown(consumer)
    assert not any(_trialq_receivers(s) for s in LIFECYCLE_SIGNALS), "left connected"


def _live_through(
    step: WorkerLifecycle, consumer: _Consumer, state: WorkerState, steps: list[Any]
) -> None:
    step.create(consumer)
    assert steps == ["preload", "plan_gpus", "probe_gpus", "measure_device_baseline"]
    assert state.concurrency == 3, "what the cores are shared among (worker/threads.py)"
    forked = LIFECYCLE_SIGNALS[:4]
    assert [len(_trialq_receivers(s)) for s in forked] == [1, 1, 1, 1], "every fork inherits"
    signals.worker_shutting_down.send(sender="w@h", how="Warm")
    assert len(steps) == 4, "preempted before it ran"

    steps.clear()
    step.start(consumer)
    step.stop(consumer)  # a lost connection: the consumer restarts, the worker lives on
    step.start(consumer)
    assert steps == ["freeze", ("w@h", ("a", "b"), 3)], "started once"
    signals.worker_shutting_down.send(sender="w@h", how="Cold")
    signals.worker_shutting_down.send(sender="w@h", how="Warm")
    assert steps[2:] == [("preempt", [])], "only a warm shutdown tells trials to stop"

    step.shutdown(consumer)
    assert steps[3:] == ["stop heartbeat"]


def test_trialq_connects_no_handler_at_import_but_the_log_one() -> None:
    """A process that builds no worker (a test's pool, the driver) runs no trialq handler."""
    for signal in (*LIFECYCLE_SIGNALS, signals.worker_ready, signals.worker_shutdown):
        assert _trialq_receivers(signal) == [], signal
    (ours,) = _trialq_receivers(signals.after_setup_logger)
    assert ours.__module__ == "trialq._celery.worker"


def test_trialq_worker_s_flags_become_its_settings_not_environment_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The flags go on top of the environment's settings, checked as those are (a password
    file still reaches the broker given by flag), and no variable is written for them."""
    import os

    from trialq.cli import _trialq_parser, _worker_settings
    from trialq.errors import UsageError

    (tmp_path / "secret").write_text("s3cret\n")
    monkeypatch.setenv("TRIALQ_BROKER_PASSWORD_FILE", str(tmp_path / "secret"))
    monkeypatch.delenv("TRIALQ_GPUS", raising=False)
    before = dict(os.environ)
    args, _rest = _trialq_parser().parse_known_args(
        ["worker", "--gpus", "all", "--trials-per-gpu", "2", "--gpu-memory-mb", "900",
         "--preload", "none", "--spare", "0", "--broker", "redis://h:6379/2"]
    )  # fmt: skip
    settings = _worker_settings(args)
    assert dict(os.environ) == before, "the worker's flags were written to the environment"
    assert (settings.gpus, settings.trials_per_gpu, settings.gpu_memory_mb) == ("all", 2, 900)
    assert (settings.preload, settings.spare_processes) == ("none", 0)
    assert settings.broker_url == "redis://:s3cret@h:6379/2"

    one_gpu, _ = _trialq_parser().parse_known_args(["worker", "--gpu", "1"])
    assert _worker_settings(one_gpu).cuda_visible_devices == "1"
    monkeypatch.setenv("TRIALQ_GPUS", "all")
    with pytest.raises(UsageError, match=r"--gpu .* and --gpus exclude each other"):
        _worker_settings(one_gpu)


def test_a_heartbeat_that_cannot_start_is_logged_and_the_worker_runs_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state = WorkerState(Settings(broker_url=NOWHERE))
    consumer = _consumer(build_worker_app(state))
    monkeypatch.setattr(lifecycle, "_freeze_started_worker", lambda: None)
    preempted: list[Any] = []
    monkeypatch.setattr(state, "preempt", preempted.append)
    step = WorkerLifecycle(consumer)
    try:
        with caplog.at_level(logging.ERROR, logger="trialq.worker"):
            step.start(consumer)  # nothing listens at NOWHERE
        assert "the worker's heartbeat did not start" in caplog.text
        signals.worker_shutting_down.send(sender="w@h", how="Warm")
        assert preempted == [[]], "SIGTERM still tells the running trials to stop"
    finally:
        step.shutdown(consumer)
