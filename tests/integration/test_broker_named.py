"""`trialq status` and `trialq health` name the broker they asked, and a `--local` study's
status asks none (issue 28, item 3): a stranger's workers on a shared Redis are not its own."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from trialq.cli import trialq_main
from trialq.settings import Settings, redacted_url
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:@127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("rediss://user:s3cret@redis:6380/1", "rediss://user:***@redis:6380/1"),
    ],
)
def test_a_broker_url_is_shown_without_its_password_and_without_a_fake_one(
    url: str, shown: str
) -> None:
    assert redacted_url(url) == shown


def test_health_names_the_broker_it_asked(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = trialq_main(["health", "--broker", redis_url])

    assert code == 1
    assert capsys.readouterr().err.strip() == (
        f"unhealthy: no worker heartbeat on this host (asked {redis_url})"
    )


def test_a_local_studys_status_takes_no_strangers_workers_for_its_own(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_workers(1)  # a stranger beating on the shared Redis
    spec = write_spec(
        """
        [study]
        name = "mine"
        n_trials = 1
        [trial]
        entrypoint = "trialq.examples.sleeper:train"
        [space.sleep_s]
        type = "categorical"
        choices = [0.0]
        """
    )
    submit_study(spec, Settings(), None, None, 1, show_progress=False)
    monkeypatch.setenv("TRIALQ_BROKER_URL", redis_url)
    capsys.readouterr()

    assert trialq_main(["status", str(spec)]) == 0

    out = capsys.readouterr().out
    assert "live workers: none (the study runs with --local" in out
    assert not re.search(r"local\d+-\w+@", out), "a --local run's worker (local0-XXXX@host) is listed"
