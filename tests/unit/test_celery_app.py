"""The Celery settings that carry the design, as the app really holds them."""

from __future__ import annotations

import os
import ssl
import types
from typing import Any

import pytest
import redis
from trial_requests import trial_request

from trialq._celery.app import create_app
from trialq._celery.dispatcher import CeleryDispatcher
from trialq.settings import Settings
from trialq.wire.messages import TrialRequest
from trialq.wire.signing import Seal


def test_the_design_settings_are_pinned() -> None:
    conf = create_app(Settings(visibility_timeout_s=7200)).conf
    assert conf.worker_max_tasks_per_child == 1
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is False
    assert conf.accept_content == ["json"] and conf.result_accept_content == ["json"]
    assert conf.task_serializer == "json" and conf.result_serializer == "json"
    assert conf.broker_transport_options["visibility_timeout"] == 7200
    assert conf.result_backend_transport_options["visibility_timeout"] == 7200
    assert conf.visibility_timeout == 7200


def test_rediss_urls_get_verified_tls_by_default() -> None:
    app = create_app(Settings(broker_url="rediss://:pw@redis.example:6380/0"))
    assert app.conf.broker_use_ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    assert app.backend.connparams["ssl_cert_reqs"] == ssl.CERT_REQUIRED  # Celery accepts it


def test_rediss_url_parameters_win() -> None:
    url = "rediss://:pw@redis.example:6380/0?ssl_cert_reqs=CERT_NONE"
    app = create_app(Settings(broker_url=url))
    assert not app.conf.broker_use_ssl
    assert app.backend.connparams["ssl_cert_reqs"] == ssl.CERT_NONE


def test_a_restarted_worker_never_takes_the_name_of_its_last_life() -> None:
    """In a container a restarted worker has the same pid and host: under the same node name
    it would look alive to the driver, and the trial its last life ran would wait forever."""
    from trialq._celery.launch import default_worker_name

    names = {default_worker_name() for _ in range(20)}
    assert len(names) == 20
    assert all(name.startswith(f"trialq-{os.getpid()}-") and name.endswith("@%h") for name in names)


def test_the_worker_command_line_carries_the_apps_design_settings() -> None:
    from trialq._celery.launch import WorkerOptions, worker_argv

    settings = Settings()
    conf = create_app(settings).conf
    options = WorkerOptions(
        queue="q1", concurrency=3, hostname=None, loglevel="DEBUG", extra=["-E"]
    )
    argv = worker_argv(settings, options)
    flags = dict(zip(argv[2:-3:2], argv[3:-3:2], strict=True))
    assert argv[1] == "worker", "the app is handed to Celery's command, not named"
    assert argv[0] == "--quiet", "Celery's banner names a password where there is none"
    assert flags["--max-tasks-per-child"] == str(conf.worker_max_tasks_per_child) == "1"
    assert flags["--prefetch-multiplier"] == str(conf.worker_prefetch_multiplier) == "1"
    assert flags["--queues"] == "q1" and flags["--concurrency"] == "3"
    assert flags["--loglevel"] == "DEBUG" and flags["--hostname"].startswith("trialq-")
    assert argv[-3:] == ["--without-mingle", "--without-gossip", "-E"], "no second's wait"


class _SendingApp:
    """Records what the dispatcher hands Celery's `send_task`."""

    def __init__(self) -> None:
        self.sent: dict[str, Any] = {}
        self.backend = types.SimpleNamespace()  # the dispatcher replaces its on_task_call

    def send_task(self, name: str, **options: Any) -> None:
        self.sent = {"name": name, **options}


def test_the_dispatcher_sends_the_requests_hard_limit_and_leaves_the_soft_one_to_the_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery's soft limit counts the trial process's waits on Redis before the trial too
    (issue 38, row 4): the trial process arms its own (`trialq.trial.soft_limit`)."""
    monkeypatch.delenv("TRIALQ_RESULT_SECRET")  # without a secret: sent as it is
    app = _SendingApp()
    settings = Settings(broker_url="redis://127.0.0.1:1/0")
    dispatcher = CeleryDispatcher(settings, app=app)  # type: ignore[arg-type]
    request = trial_request(study="limits", timeout_s=60, hard_limit_s=90)

    assert dispatcher.submit(request, "gpu", task_id="t-1") == "t-1"

    assert app.sent["time_limit"] == 90 and "soft_time_limit" not in app.sent
    assert app.sent["args"] == [request.model_dump(mode="json", exclude={"signature"})]


def test_the_dispatcher_signs_each_request_for_its_task_id() -> None:
    """With a secret, the request goes out signed for its task id (a worker runs no other:
    `WorkerChild.run`); without one, unsigned."""
    secret = "a-deployment-secret-0123456789"
    app = _SendingApp()
    settings = Settings(broker_url="redis://127.0.0.1:1/0", result_secret=secret)
    dispatcher = CeleryDispatcher(settings, app=app)  # type: ignore[arg-type]
    request = trial_request(study="signed")

    dispatcher.submit(request, "gpu", task_id="t-1")

    (sent,) = app.sent["args"]
    assert sent["signature"] is not None
    assert Seal(secret).task_refusal("t-1", sent) is None
    assert Seal(secret).task_refusal("t-2", sent) is not None
    received = TrialRequest.model_validate(sent)
    assert received.answers_signed  # this driver signs its answers to the trial's questions
    assert received.model_copy(update={"signature": None, "answers_signed": False}) == request


@pytest.mark.parametrize(
    "refusal",
    [
        redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.ConnectionError("Connection refused"),
    ],
)
def test_the_result_backend_retries_a_redis_that_refuses_writes_for_a_while(
    refusal: redis.RedisError,
) -> None:
    """A full Redis's refusal of STARTED made the worker's parent exit ("Unrecoverable
    error: OutOfMemoryError"), its trial waited for forever (issue 38, row 2)."""
    app = create_app(Settings(broker_url="redis://127.0.0.1:1/0"))
    assert app.backend.exception_safe_to_retry(refusal)
    assert not app.backend.exception_safe_to_retry(redis.ResponseError("WRONGTYPE"))
