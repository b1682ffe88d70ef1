"""A broker writer without the secret rewrites, replays and forges tasks on the queue: a
genuine worker runs none of them, and every trial is told the value its own params gave
(docs/deployment.md#security). Results forged in Redis: tests/faults/test_security.py."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from waiting import wait_until

from faults.harness import DriverRun, assert_clean, fault_spec, grid
from trialq.local import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.integration]

QUEUE = "gpu"
SLEEPS = (0.3, 0.6, 0.9, 1.2)
Rewrite = Callable[[dict[str, Any]], dict[str, Any]]


def _request_of(raw: bytes) -> dict[str, Any]:
    """The trial request a queued kombu message carries (its base64 JSON body's first arg)."""
    args, _, _ = json.loads(base64.b64decode(json.loads(raw)["body"]))
    return args[0]  # type: ignore[no-any-return]


def _rewritten(raw: bytes, rewrite: Rewrite, new_id: bool = False) -> bytes:
    """The message with its request rewritten as `rewrite` says (and, with `new_id`, under a
    task id of its own): what anyone with the broker's password can write."""
    message = json.loads(raw)
    args, kwargs, embed = json.loads(base64.b64decode(message["body"]))
    body = [[rewrite(args[0]), *args[1:]], kwargs, embed]
    message["body"] = base64.b64encode(json.dumps(body).encode()).decode()
    if new_id:
        task_id = str(uuid.uuid4())
        message["headers"]["id"] = message["headers"]["root_id"] = task_id
        message["properties"]["correlation_id"] = task_id
        message["properties"]["delivery_tag"] = str(uuid.uuid4())
    return json.dumps(message).encode()


def _rewrite_queued(client: redis.Redis, rewrite: Rewrite, done: set[int]) -> None:
    """Rewrite every queued message of a trial not rewritten before, atomically (a worker's
    pop between the read and the write would make the write land on another message)."""
    with client.pipeline() as pipe:
        try:
            pipe.watch(QUEUE)
            queued: list[bytes] = pipe.lrange(QUEUE, 0, -1)  # type: ignore[assignment]
            pipe.multi()
            now: set[int] = set()
            for index, raw in enumerate(queued):
                number = _request_of(raw)["number"]
                if number not in done:
                    pipe.lset(QUEUE, index, _rewritten(raw, rewrite))
                    now.add(number)
            pipe.execute()
            done |= now
        except redis.WatchError:
            pass  # a worker took a message meanwhile: none was rewritten, try again


def _run_rewriting(
    tmp_path: Path, redis_url: str, cluster: LocalCluster, rewrite: Rewrite, fault: str
) -> tuple[DriverRun, set[int], Path]:
    """Run a study of four trials, four in flight on one worker, rewriting each queued
    trial's message once; the run, the trials rewritten and the worker's log."""
    run = DriverRun(tmp_path, redis_url)
    run.write_spec(fault_spec("sleeps_then_echoes", grid("sleep_s", *SLEEPS), 4, 4))
    client = redis.Redis.from_url(redis_url)
    process = run.start()
    rewritten: set[int] = set()
    while process.poll() is None:
        _rewrite_queued(client, rewrite, rewritten)
        time.sleep(0.01)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert_clean(run.judge(fault, 4))
    return run, rewritten, cluster.log_dir / "worker0.log"


def _told_their_own(run: DriverRun) -> None:
    """Every trial told the value its own params give (sleep_s * 100), from its worker."""
    for trial in run.study().trials:
        assert trial.value == pytest.approx(trial.params["sleep_s"] * 100), trial


def test_params_rewritten_on_the_broker_are_never_run_and_each_trial_is_told_its_own(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    cluster = start_workers(1)

    def faster(request: dict[str, Any]) -> dict[str, Any]:
        return {**request, "params": {"sleep_s": 0.01}}

    run, rewritten, log = _run_rewriting(
        tmp_path, redis_url, cluster, faster, "task params rewritten in Redis"
    )
    _told_their_own(run)
    assert len(rewritten) >= 3, rewritten  # the three queued behind the first, at least
    _said_at_least(log, "refused, nothing runs: its signature does not verify", len(rewritten))


def test_an_entrypoint_rewritten_within_the_allow_list_is_never_run(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    cluster = start_workers(1)

    def lying(request: dict[str, Any]) -> dict[str, Any]:
        return {**request, "entrypoint": "trials:echoes_a_lie"}

    run, rewritten, log = _run_rewriting(
        tmp_path, redis_url, cluster, lying, "task entrypoint rewritten in Redis"
    )
    _told_their_own(run)
    assert len(rewritten) >= 3, rewritten
    _said_at_least(log, "refused, nothing runs: its signature does not verify", len(rewritten))


def test_unsigned_tasks_and_old_tasks_replayed_are_never_told(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    """Each message seen is pushed back once it has gone: as it was (its task id an old
    one's), under a new task id, and stripped of its signature; the study is told each
    trial once, its own value."""
    cluster = start_workers(1)
    run = DriverRun(tmp_path, redis_url)
    run.write_spec(fault_spec("sleeps_then_echoes", grid("sleep_s", *SLEEPS), 4, 2))  # one waits queued
    client = redis.Redis.from_url(redis_url)
    process = run.start()
    seen: dict[bytes, bool] = {}  # message -> replayed yet
    while process.poll() is None:
        queued = client.lrange(QUEUE, 0, -1)
        for raw in queued:
            seen.setdefault(raw, False)
        for raw, replayed in seen.items():
            if not replayed and raw not in queued:
                client.lpush(QUEUE, raw, _rewritten(raw, lambda r: r, new_id=True))
                client.lpush(QUEUE, _rewritten(raw, _unsigned, new_id=True))
                seen[raw] = True
        time.sleep(0.01)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert_clean(run.judge("old tasks replayed, unsigned tasks sent", 4))
    _told_their_own(run)
    assert sum(seen.values()) >= 2, seen  # replays went out while the driver ran
    log = cluster.log_dir / "worker0.log"
    _said_at_least(log, "refused, nothing runs: unsigned", 1)
    _said_at_least(log, "refused, nothing runs: its signature does not verify", 1)


def _said_at_least(log: Path, line: str, times: int) -> None:
    """Wait for the worker's log to say `line` `times` times (its trial processes' lines
    reach the file through its parent)."""
    wait_until(lambda: log.read_text().count(line) >= times, 10, f"{times} x {line!r} in {log}")


def _unsigned(request: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in request.items() if k != "signature"}


def test_a_driver_without_the_secret_is_warned_once_and_its_unsigned_tasks_stop_the_run(
    tmp_path: Path,
    redis_url: str,
    start_workers: Callable[..., LocalCluster],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Workers with the secret refuse a driver's unsigned tasks: each is sent again, and the
    run of refusals stops the run (`max_failures_in_a_row`); nothing runs, nothing is told."""
    cluster = start_workers(1)
    monkeypatch.delenv("TRIALQ_RESULT_SECRET")  # the driver's alone: its workers hold it
    run = DriverRun(tmp_path, redis_url)
    run.write_spec(fault_spec("sleeps_then_echoes", grid("sleep_s", *SLEEPS), 4, 1))
    code, err = run.run(timeout=120)
    assert code not in (0, 4), err
    assert err.count("tasks and results are not authenticated") == 1, err
    assert "refused by their workers" in err, err
    assert not [t for t in run.study().trials if t.state.is_finished()], "a trial was told"
    _said_at_least(cluster.log_dir / "worker0.log", "refused, nothing runs: unsigned", 5)
