"""The fault suite: each fault against real worker processes, the real Redis and the real
driver process; each ends with the study at n_trials, 0 lost, 0 told twice, 0 RUNNING."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import psutil
import pytest
import redis
from outage_proxy import OutageProxy
from waiting import wait_for_redis, wait_until

from faults.harness import (
    FAST_HEARTBEAT,
    DriverRun,
    assert_clean,
    delete_study,
    fault_spec,
    finished_count,
    grid,
    worker_parent_running_a_trial,
)
from trialq.local import LocalCluster, free_port, redis_server_binary
from trialq.wire.heartbeat import running_trials
from trialq.wire.keys import result_key

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def test_sigkill_of_the_trial_process_is_retried_with_the_same_params_when_asked(
    run: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    start_workers(2, extra_env=FAST_HEARTBEAT)
    spec = fault_spec(
        "kills_itself_on_first_attempt", grid("x", "kill", "ok"), 6, retry_crashes=True
    )
    run.write_spec(spec)
    code, err = run.run()
    verdict = run.judge("SIGKILL of the trial process", 6)
    assert_clean(verdict)
    assert code == 0, err
    killed = [t for t in run.study().trials if t.params["x"] == "kill"]
    assert killed and all(t.user_attrs["attempts"] == 2 for t in killed)
    assert all(t.user_attrs["outcome"] == "ok" for t in killed)


def test_a_trial_that_kills_its_process_every_time_does_not_loop(
    run: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    start_workers(2, extra_env=FAST_HEARTBEAT)
    spec = fault_spec(
        "always_kills_itself", grid("x", "kill"), 2, max_retries=2, retry_crashes=True
    )
    run.write_spec(spec)
    run.run()
    verdict = run.judge("trial that always SIGKILLs itself", 2)
    assert_clean(verdict)
    for trial in run.study().trials:
        assert trial.state.name == "FAIL"
        assert trial.user_attrs["outcome"] == "crashed"
        assert trial.user_attrs["attempts"] == 3  # 1 + max_retries, then given up


def test_sigkill_of_a_worker_parent_mid_trial(
    run: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    cluster = start_workers(2, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 3.0), 4))
    driver = run.start()
    victim = worker_parent_running_a_trial(cluster)
    os.killpg(victim.pid, signal.SIGKILL)  # the worker and its trial child: a node gone
    _, err = driver.communicate(timeout=240)
    verdict = run.judge("SIGKILL of a worker (parent and child)", 4)
    assert_clean(verdict)
    assert driver.returncode == 0, err
    assert any(t.user_attrs["attempts"] == 2 for t in run.study().trials)


def test_sigterm_of_a_worker_finishes_its_trial_and_takes_no_new_one(
    run: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    cluster = start_workers(1, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 3.0), 3))
    driver = run.start()
    victim = worker_parent_running_a_trial(cluster)
    victim.send_signal(signal.SIGTERM)
    victim.wait(timeout=60)
    # The result is in Redis once the worker is gone; the driver tells it a moment later.
    wait_until(lambda: finished_count(run) >= 1, 60, "the running trial told")
    first = [t for t in run.study().trials if t.state.is_finished()]
    assert len(first) == 1, "the running trial finishes during warm shutdown, no other"
    assert first[0].user_attrs["outcome"] == "ok" and first[0].user_attrs["attempts"] == 1
    start_workers(1, extra_env=FAST_HEARTBEAT)
    _, err = driver.communicate(timeout=240)
    assert_clean(run.judge("SIGTERM of a worker (warm shutdown)", 3))
    assert driver.returncode == 0, err


@pytest.fixture
def run_on_each_storage(storage_url: str, tmp_path: Path, redis_url: str) -> Iterator[DriverRun]:
    """A driver run on SQLite (commits in the loop) and on PostgreSQL (commits beside it)."""
    run = DriverRun(tmp_path, redis_url, storage_url=storage_url)
    delete_study(run)  # left by an earlier run that was itself killed
    yield run
    delete_study(run)


def test_driver_sigkilled_and_resumed(
    run_on_each_storage: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    run = run_on_each_storage
    start_workers(2, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 1.5), 6))
    driver = run.start()
    wait_until(lambda: finished_count(run) >= 1, 120, "a trial to finish")
    driver.kill()
    driver.wait()
    code, err = run.run()
    storage = "SQLite" if run.storage.startswith("sqlite") else "PostgreSQL"
    verdict = run.judge(f"driver SIGKILLed, resumed ({storage})", 6)
    assert_clean(verdict)
    assert code == 0, err


def test_the_same_task_delivered_twice_is_told_once(
    run: DriverRun, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 0.5), 3))
    driver = run.start()
    client = redis.Redis.from_url(redis_url)
    wait_until(lambda: client.llen("gpu") >= 1, 120, "a message on the queue")
    for message in client.lrange("gpu", 0, -1):
        client.lpush("gpu", message)  # every message now sits twice on the queue
    start_workers(2, extra_env=FAST_HEARTBEAT)
    _, err = driver.communicate(timeout=240)
    verdict = run.judge("same task delivered twice", 3)
    assert_clean(verdict)
    assert driver.returncode == 0, err


def test_redis_restarted_mid_study(
    tmp_path: Path, start_workers: Callable[..., LocalCluster]
) -> None:
    port = free_port()
    server = _start_persistent_redis(tmp_path, port)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        start_workers(2, extra_env=FAST_HEARTBEAT, broker_url=url)
        run = DriverRun(tmp_path, url)
        run.write_spec(fault_spec("sleeps", grid("sleep_s", 1.0), 6))
        driver = run.start()
        wait_until(lambda: finished_count(run) >= 1, 120, "a trial to finish")
        redis.Redis.from_url(url).shutdown(save=True)
        server.wait(timeout=30)
        time.sleep(2)
        server = _start_persistent_redis(tmp_path, port)
        _, err = driver.communicate(timeout=300)
        verdict = run.judge("Redis restarted mid-study (AOF on)", 6)
        assert_clean(verdict)
        assert driver.returncode == 0, err
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize(
    ("fault", "entrypoint", "space", "trial_keys", "outcome"),
    [
        (
            "OOM: over memory_limit_mb",
            "allocates",
            grid("mb", 400),
            {"memory_limit_mb": 150},
            "oom",
        ),
        ("OOM: MemoryError", "raises_memory_error", grid("x", 1), {}, "oom"),
        ("timeout: soft limit", "sleeps", grid("sleep_s", 30.0), {"timeout_s": 1}, "timeout"),
        (
            "timeout: soft limit ignored, hard kill",
            "ignores_the_soft_limit",
            grid("x", 1),
            {"timeout_s": 1, "kill_grace_s": 2},
            "timeout",
        ),
        ("a raising trial", "raises", grid("x", "bad"), {}, "error"),
    ],
)
def test_failing_trials_get_their_outcome_and_are_not_retried(
    run: DriverRun,
    start_workers: Callable[..., LocalCluster],
    fault: str,
    entrypoint: str,
    space: str,
    trial_keys: dict[str, object],
    outcome: str,
) -> None:
    start_workers(2, extra_env=FAST_HEARTBEAT)
    spec = fault_spec(entrypoint, space, 2, **trial_keys).replace("timeout_s = 60\n", "")
    if "timeout_s" not in trial_keys:
        spec = spec.replace("[trial]\n", "[trial]\n        timeout_s = 60\n")
    run.write_spec(spec)
    code, err = run.run()
    verdict = run.judge(fault, 2)
    assert_clean(verdict)
    assert code == 1, err  # done, with no complete trial
    for trial in run.study().trials:
        assert trial.state.name == "FAIL", trial.user_attrs
        if "hard kill" in fault:  # killed 3 s in: not a trial that took no time
            assert trial.user_attrs["duration_s"] >= 2.0, trial.user_attrs
        assert trial.user_attrs["outcome"] == outcome, trial.user_attrs
        assert trial.user_attrs["attempts"] == 1


def _start_persistent_redis(folder: Path, port: int) -> subprocess.Popen[bytes]:
    command = [
        redis_server_binary(), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(folder),
        "--appendonly", "yes", "--save", "", "--maxmemory-policy", "noeviction",
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    wait_for_redis(redis.Redis(port=port), timeout_s=20)
    return server


# --- the storage and its users (issue 16) --------------------------------------------------


def test_postgresql_cut_off_mid_study_is_ridden_out(
    run_via_proxy: DriverRun, proxy: OutageProxy, start_workers: Callable[..., LocalCluster]
) -> None:
    run = run_via_proxy
    start_workers(2, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 1.0), 8))
    driver = run.start()
    wait_until(lambda: finished_count(run) >= 1, 120, "a trial to finish")
    running = wait_until(
        lambda: running_trials(redis.Redis.from_url(run.broker_url)), 60, "a trial to run"
    )
    proxy.cut()  # until the trial's result came in, while nothing could be written
    wait_until(lambda: _result_stored(run, running[0].task_id), 60, "its result")
    proxy.restore()
    for _ in range(3):  # the server drops every connection, as a restart does
        proxy.cut()
        time.sleep(0.3)
        proxy.restore()
        time.sleep(1.5)
    _, err = driver.communicate(timeout=300)
    verdict = run.judge("PostgreSQL down past a result, 3 drops", 8)
    assert verdict.passed, (verdict, err)
    assert driver.returncode == 0, err
    assert "storage unreachable" in err and "storage back after" in err, err


def _result_stored(run: DriverRun, task_id: str) -> bool:
    """Whether an attempt's result is in Redis, where it comes in whether or not the driver
    can write it down."""
    return bool(redis.Redis.from_url(run.broker_url).exists(result_key(task_id)))


def test_an_outage_longer_than_the_limit_exits_3_and_the_next_run_finishes(
    run_via_proxy: DriverRun, proxy: OutageProxy, start_workers: Callable[..., LocalCluster]
) -> None:
    run = run_via_proxy
    start_workers(2, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 1.0), 6))
    driver = run.start("--outage-limit", "3")
    wait_until(lambda: finished_count(run) >= 1, 120, "a trial to finish")
    proxy.cut()
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 3, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and "storage unreachable for 3 s" in errors[0], err
    assert "Traceback" not in err, err
    proxy.restore()
    code, err = run.run()
    verdict = run.judge("PostgreSQL down > limit: exit 3, rerun", 6)
    assert_clean(verdict)
    assert code == 0, err


def test_a_trial_failed_from_outside_is_stopped_and_not_retried(
    run_on_each_storage: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    run = run_on_each_storage
    cluster = start_workers(2, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("stalls_first", grid("x", 1), 3))
    driver = run.start()
    pid = _trial_process_of(run, cluster, number=0)
    # optuna-dashboard's Fail button, from another process, through Optuna's own API.
    run.study().tell(0, state=optuna.trial.TrialState.FAIL)
    wait_until(lambda: not psutil.pid_exists(pid), 60, "the stopped trial's process to go")
    _, err = driver.communicate(timeout=120)
    storage = "SQLite" if run.storage.startswith("sqlite") else "PostgreSQL"
    verdict = run.judge(f"trial failed from outside ({storage})", 3)
    assert_clean(verdict)
    assert driver.returncode == 0, err
    stopped = run.study().trials[0]
    assert stopped.state.name == "FAIL" and stopped.user_attrs["outcome"] == "stopped"
    assert stopped.user_attrs["attempts"] == 1, "a stopped trial is not retried"
    assert stopped.user_attrs["duration_s"] > 0 and stopped.user_attrs["worker_host"]
    assert "#0 finished from outside as FAIL" in err, err


def test_a_second_driver_on_the_same_study_is_refused_before_it_writes(
    run_on_each_storage: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    run = run_on_each_storage
    cluster = start_workers(2, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("stalls_first", grid("x", 1), 3))
    first = run.start()
    _trial_process_of(run, cluster, number=0)
    wait_until(lambda: finished_count(run) == 2, 120, "the short trials to finish")
    before = [(t.number, t.state, t.user_attrs) for t in run.study().trials]  # and still
    assert first.poll() is None, first.communicate()
    code, err = run.run()
    assert code == 2, err
    assert err.strip().startswith("error: study 'faults' has a driver already"), err
    assert len(err.strip().splitlines()) == 1, err
    assert [(t.number, t.state, t.user_attrs) for t in run.study().trials] == before
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=60)


def _trial_process_of(run: DriverRun, cluster: LocalCluster, number: int) -> int:
    """The pid of the process running trial `number`, once it has started."""
    client = redis.Redis.from_url(cluster.broker_url)

    def started_pid() -> int | None:
        try:
            trials = run.study().trials
        except KeyError:  # the study is not created yet
            trials = []
        task_id = next((t.user_attrs.get("task_id") for t in trials if t.number == number), None)
        meta = json.loads(client.get(f"celery-task-meta-{task_id}") or b"{}")
        return int(meta["result"]["pid"]) if meta.get("status") == "STARTED" else None

    return wait_until(started_pid, 60, f"trial {number} to start")
