"""Two workers of one name (issue 38, row 6).

Two workers started with the same `--hostname` share one heartbeat key: while either lives
it stays fresh. One of them `kill -9`ed mid-trial was never counted lost, and the driver
waited forever. `trialq worker` now refuses a name another live worker beats as (exit 2,
one line); and the driver judges a running attempt by its own trial process's beacon once
seen, so twins that start anyway (Celery's own `celery -A trialq.worker worker`, which that
check does not see) lose nothing either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from waiting import wait_until

from faults.harness import (
    FAST_HEARTBEAT,
    TESTS_DIR,
    DriverRun,
    assert_clean,
    fault_spec,
    grid,
    trial_process_started,
)
from trialq._celery.launch import WorkerOptions, worker_argv
from trialq.settings import Settings
from trialq.wire import heartbeat
from trialq.wire.keys import worker_key

pytestmark = [pytest.mark.faults, pytest.mark.integration]

NAME = "twin@test-host"


def _environment(broker_url: str) -> dict[str, str]:
    return {
        **os.environ,
        **FAST_HEARTBEAT,
        "TRIALQ_BROKER_URL": broker_url,
        "TRIALQ_RESULT_BACKEND": broker_url,
        "TRIALQ_ALLOWED_MODULES": "trials",
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
    }


def _trialq_worker(broker_url: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "trialq", "worker", "--queue", "gpu", "--concurrency", "1",
               "--hostname", NAME, "--loglevel", "INFO"]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(command, env=_environment(broker_url), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


def _celery_worker(broker_url: str, log: Path) -> subprocess.Popen[bytes]:
    """A worker started by Celery's own command, with the flags `trialq worker` gives it."""
    options = WorkerOptions(queue="gpu", concurrency=1, hostname=NAME, loglevel="INFO")
    argv = worker_argv(Settings(broker_url=broker_url), options)
    command = [sys.executable, "-m", "celery", "-A", "trialq.worker", *argv]
    with log.open("wb") as out:
        return subprocess.Popen(command, env=_environment(broker_url), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The workers a test starts: killed, with their trial processes, afterwards."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for worker in started:
        if worker.poll() is None:
            for child in psutil.Process(worker.pid).children(recursive=True):
                child.kill()
            worker.kill()
        worker.wait()


def _ready(log: Path) -> bool:
    return f"worker {NAME} ready" in log.read_text(errors="replace")


def test_a_worker_refuses_a_name_another_live_worker_beats_as(
    redis_url: str, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    first_log = tmp_path / "first.log"
    workers.append(_trialq_worker(redis_url, first_log))
    wait_until(lambda: _ready(first_log), 60, "the first worker to beat")

    second = subprocess.run(
        [sys.executable, "-m", "trialq", "worker", "--queue", "gpu", "--hostname", NAME],
        env=_environment(redis_url), capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert second.returncode == 2, second.stderr
    lines = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"another worker beats as '{NAME}'" in lines[0], second.stderr
    assert "Traceback" not in second.stderr, second.stderr
    assert f"pid {workers[0].pid}" in lines[0], second.stderr
    assert workers[0].poll() is None, "the first worker runs on"


def test_a_name_whose_worker_died_is_taken_once_its_heartbeat_is_not_renewed(
    redis_url: str, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    """A worker restarted under its fixed name after a `kill -9` finds its predecessor's
    heartbeat, unrenewed until its TTL (here written as such a worker leaves it): it starts."""
    dead = heartbeat.WorkerBeat(NAME, "test-host", 1, ("gpu",), None, 0.0)
    client = redis.Redis.from_url(redis_url)
    client.set(worker_key(NAME), json.dumps(dead.heartbeat_json()), px=60_000)
    log = tmp_path / "restarted.log"

    workers.append(_trialq_worker(redis_url, log))

    wait_until(lambda: _ready(log), 60, "the restarted worker to beat")


@pytest.mark.timeout(300)
def test_twin_workers_one_killed_mid_trial_the_trial_is_lost_and_sent_again_told_once(
    run: DriverRun, tmp_path: Path, workers: list[subprocess.Popen[bytes]]
) -> None:
    logs = [tmp_path / "twin0.log", tmp_path / "twin1.log"]
    workers.extend(_celery_worker(run.broker_url, log) for log in logs)
    wait_until(lambda: all(_ready(log) for log in logs), 60, "both twins to beat")
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 4.0), 1, in_flight=1, max_retries=1))
    driver = run.start()

    trial_process = trial_process_started(run.broker_url)
    victim = trial_process.parent()
    assert victim.pid in {w.pid for w in workers}
    for process in (victim, trial_process):  # the worker, kill -9ed with its trial
        process.send_signal(signal.SIGKILL)
    try:
        _, err = driver.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        driver.kill()
        _, err = driver.communicate()
        raise AssertionError(f"the driver waited on: {err[-3000:]}") from None

    assert_clean(run.judge("twin workers of one name, one kill -9ed", 1))
    assert driver.returncode == 0, err
    (trial,) = run.study().trials
    assert trial.user_attrs["outcome"] == "ok" and trial.user_attrs["attempts"] == 2, err[-3000:]
    said = "".join(log.read_text(errors="replace") for log in logs)
    assert "another worker beats under this worker's name" in said, "the twin was not said"
