"""A Redis full or frozen under the driver (issue 38, rows 2, 4 and 9).

Redis at `maxmemory` under `noeviction` (the policy compose and k8s ship) refuses writes:
the driver's write that meets it (a trial sent, a withdrawn mark) ended the run with a
traceback and exit 4, trials left RUNNING (issue 38, row 2). It is an outage now: one line,
ridden out up to the outage limit, and the study goes on once Redis takes writes again."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from waiting import wait_for_redis, wait_until

from faults.harness import FAST_HEARTBEAT, DriverRun, fault_spec, grid, trial_process_started
from trialq.local import LocalCluster, free_port, redis_server_binary
from trialq.wire.keys import ATTEMPT_PREFIX

pytestmark = [pytest.mark.faults, pytest.mark.integration]

FULL_FOR_S = 8.0
"""Past the heartbeat's TTL (3 s): the trial is taken for lost while Redis is full."""


@pytest.fixture
def own_redis_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A Redis of this test's own: its memory limit is set for the whole server, and it
    may be frozen (SIGSTOP)."""
    port = free_port()
    server = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"redis://127.0.0.1:{port}/0"
        wait_for_redis(redis.Redis.from_url(url))
        yield url, server
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.terminate()
        server.wait()


@pytest.fixture
def own_redis(own_redis_server: tuple[str, subprocess.Popen[bytes]]) -> str:
    return own_redis_server[0]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("full_at", ["mid-trial", "as its process claims it"])
def test_a_full_redis_is_an_outage_ridden_out_and_the_study_finishes(
    full_at: str,
    own_redis: str,
    tmp_path: Path,
    start_workers: Callable[..., LocalCluster],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Full while a trial runs and past the heartbeat's TTL: the worker's beats are refused,
    the driver takes the attempt for lost and writes its withdrawn mark into the full Redis
    (where it crashed), then, after Redis takes writes again, finishes. Full as the trial
    process claims its trial: its store of STARTED was refused, the worker's parent exited
    on it ("Unrecoverable error: OutOfMemoryError"), and the driver, with nothing written
    meanwhile, waited forever without a word (2 runs in 5; the result backend retries
    such a refusal now, `trialq._celery.backend`)."""
    for name, value in FAST_HEARTBEAT.items():
        monkeypatch.setenv(name, value)
    start_workers(1, broker_url=own_redis, extra_env=FAST_HEARTBEAT)
    client = redis.Redis.from_url(own_redis)
    run = DriverRun(tmp_path, own_redis)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 8.0), 1, in_flight=1))
    driver = run.start("--outage-limit", "60")
    if full_at == "mid-trial":
        trial_process_started(own_redis)
    else:  # polled tight: the beacon comes milliseconds before STARTED
        wait_until(lambda: any(client.scan_iter(match=ATTEMPT_PREFIX + "*")), 60,
                   "the trial process to claim the trial", interval_s=0.002)  # fmt: skip
    client.config_set("maxmemory", 1)  # every write refused: OOM command not allowed
    time.sleep(FULL_FOR_S)
    client.config_set("maxmemory", 0)
    try:
        _, err = driver.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        driver.kill()
        _, err = driver.communicate()
        raise AssertionError(err) from None

    assert driver.returncode == 0, err
    if full_at == "mid-trial":  # a lost attempt's mark meets the full Redis
        assert "broker unreachable (" in err and "maxmemory" in err, err
    assert "Traceback" not in err, err
    assert [t.state.name for t in run.study().trials] == ["COMPLETE"], err


@pytest.mark.parametrize("frozen_at", ["mid-trial", "as its process claims it"])
def test_a_trial_that_returned_ok_is_told_ok_though_its_soft_limit_passed_while_redis_froze(
    frozen_at: str,
    own_redis_server: tuple[str, subprocess.Popen[bytes]],
    tmp_path: Path,
    start_workers: Callable[..., LocalCluster],
) -> None:
    """Issue 38, row 4, in short: Redis frozen 10 s past a trial's 5 s soft limit; the trial
    returns at 2 s of its own time, told `ok`. Frozen mid-trial, the result waits for Redis
    (`tests/unit/test_result_after_return.py`: the battery froze it 300 s, past the 2 min the
    result used to wait). Frozen as the trial process claims its trial, before Celery stored
    STARTED: Celery's soft limit, counted from when the pool took the task, passed in that
    wait and failed the attempt `timeout` before the trial ran (1 run in 4 here, and in CI's
    rehearsal); the limit is the trial process's own now, counted from the trial's code."""
    url, server = own_redis_server
    start_workers(1, broker_url=url)
    client = redis.Redis.from_url(url)
    run = DriverRun(tmp_path, url)
    spec = fault_spec("sleeps", grid("sleep_s", 2.0), 1, in_flight=1)
    run.write_spec(spec.replace("timeout_s = 60", "timeout_s = 5"))
    driver = run.start("--outage-limit", "60")
    if frozen_at == "mid-trial":
        trial_process_started(url)  # Celery's STARTED stored
    else:  # polled tight: the beacon comes milliseconds before STARTED
        wait_until(lambda: any(client.scan_iter(match=ATTEMPT_PREFIX + "*")), 60,
                   "the trial process to claim the trial", interval_s=0.002)  # fmt: skip
    os.kill(server.pid, signal.SIGSTOP)  # frozen: connections open, no answer
    time.sleep(10.0)  # the trial returns at 2 s; its soft limit passes at 5 s
    os.kill(server.pid, signal.SIGCONT)
    _, err = driver.communicate(timeout=120)

    assert driver.returncode == 0, err
    (trial,) = run.study().trials
    assert trial.user_attrs["outcome"] == "ok", (trial.user_attrs, err)


def test_ctrl_c_while_redis_is_frozen_does_not_claim_the_queued_trials_withdrawn(
    own_redis_server: tuple[str, subprocess.Popen[bytes]],
    tmp_path: Path,
    start_workers: Callable[..., LocalCluster],
) -> None:
    """Issue 38, row 9: it printed `queued trials withdrawn` though nothing could be."""
    url, server = own_redis_server
    start_workers(1, broker_url=url)
    run = DriverRun(tmp_path, url)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 30.0, 30.5), 2, in_flight=2))
    driver = run.start("--outage-limit", "60")
    # Both sent: one started, one queued (a trial is RUNNING in the study before it is sent,
    # and a driver interrupted before its first send has nothing to withdraw).
    trial_process_started(url)
    client = redis.Redis.from_url(url)
    wait_until(lambda: client.llen("gpu") >= 1, 60, "the second trial to be queued")
    os.kill(server.pid, signal.SIGSTOP)
    try:
        time.sleep(0.5)
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=120)
    finally:
        os.kill(server.pid, signal.SIGCONT)

    assert driver.returncode == 130, err
    assert "queued trials withdrawn" not in err, err
    assert "queued trials were not withdrawn" in err, err


def test_a_broker_that_evicts_is_said_by_the_driver_and_each_worker(
    own_redis_server: tuple[str, subprocess.Popen[bytes]],
    tmp_path: Path,
    start_workers: Callable[..., LocalCluster],
) -> None:
    """Issue 38, row 12: under `allkeys-lru` Redis evicted heartbeats and two trials were
    killed and run again, with no word of the misconfiguration."""
    url, _ = own_redis_server
    redis.Redis.from_url(url).config_set("maxmemory-policy", "allkeys-lru")
    cluster = start_workers(1, broker_url=url)
    run = DriverRun(tmp_path, url)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 0.1), 1, in_flight=1))

    code, err = run.run()

    assert code == 0, err
    said = "maxmemory-policy is 'allkeys-lru'"
    assert len([line for line in err.splitlines() if said in line]) == 1, err
    logs = "".join(path.read_text() for path in cluster.log_dir.glob("*.log"))
    assert said in logs, "the worker did not say it"
