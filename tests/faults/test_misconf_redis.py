"""A Redis refusing writes because its snapshots fail (`MISCONF`, `stop-writes-on-bgsave-
error`) is an outage ridden out, as a full or read-only one is, wherever the refusal meets
trialq: a lone command, or a command inside a pipeline, where redis-py puts the reply after
a prefix naming the command (that one ended the driver with exit 1, trials left RUNNING)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from waiting import wait_for_redis, wait_until

from faults.harness import (
    FAST_HEARTBEAT,
    DriverRun,
    assert_clean,
    fault_spec,
    grid,
    trial_process_started,
)
from trialq.local import LocalCluster, free_port, redis_server_binary
from trialq.wire.broker_away import broker_away

pytestmark = [pytest.mark.faults, pytest.mark.integration]

REFUSING_FOR_S = 8.0
"""Past the heartbeat's TTL (3 s): the trial is taken for lost while Redis refuses writes."""


@dataclass
class SnapshotRedis:
    """A Redis of the test's own that saves snapshots into `folder`: its snapshots fail
    while the snapshot's file name is taken by a folder, and from then on it refuses every
    write with MISCONF until a snapshot succeeds again."""

    url: str
    folder: Path

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def fail_snapshots(self) -> None:
        (self.folder / "dump.rdb").mkdir()
        (self.folder / "dump.rdb" / "in-the-way").touch()
        self._snapshot("err")

    def heal(self) -> None:
        shutil.rmtree(self.folder / "dump.rdb")
        self._snapshot("ok")

    def _snapshot(self, status: str) -> None:
        client = self.client()
        wait_until(lambda: not client.info("persistence")["rdb_bgsave_in_progress"], 30,
                   "the snapshot in progress to end")  # fmt: skip
        client.bgsave()
        wait_until(lambda: client.info("persistence")["rdb_last_bgsave_status"] == status, 30,
                   f"a snapshot to end {status}")  # fmt: skip


@pytest.fixture
def snapshot_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnapshotRedis]:
    folder = tmp_path_factory.mktemp("snapshots")
    port = free_port()
    server = subprocess.Popen(
        [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
         "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"redis://127.0.0.1:{port}/0"
        wait_for_redis(redis.Redis.from_url(url))
        redis.Redis.from_url(url).config_set("save", "3600 1")
        yield SnapshotRedis(url, folder)
    finally:
        server.kill()  # SIGTERM would save a snapshot first, and wait on one that fails
        server.wait()


@pytest.mark.parametrize("transaction", [True, False], ids=["multi/exec", "plain pipeline"])
def test_misconf_inside_a_pipeline_means_the_broker_is_away(
    snapshot_redis: SnapshotRedis, transaction: bool
) -> None:
    client = snapshot_redis.client()
    snapshot_redis.fail_snapshots()
    with pytest.raises(redis.ResponseError, match="of pipeline caused error: MISCONF") as met:
        client.pipeline(transaction=transaction).set("a", 1).incr("b").execute()
    with pytest.raises(redis.ResponseError, match=r"^MISCONF") as alone:
        client.set("a", 1)

    assert broker_away(alone.value)
    assert broker_away(met.value)
    snapshot_redis.heal()
    with pytest.raises(redis.ResponseError, match="caused error: value is not an integer") as bug:
        client.pipeline(transaction=transaction).set("a", "text").incr("a").execute()
    assert not broker_away(bug.value), "a mistake in a pipeline is no outage"


@pytest.mark.timeout(420)
def test_a_redis_refusing_writes_with_misconf_is_ridden_out_and_the_study_finishes(
    snapshot_redis: SnapshotRedis,
    tmp_path: Path,
    start_workers: Callable[..., LocalCluster],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in FAST_HEARTBEAT.items():
        monkeypatch.setenv(name, value)
    url = snapshot_redis.url
    start_workers(1, broker_url=url, extra_env=FAST_HEARTBEAT)
    run = DriverRun(tmp_path, url)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 8.0, 8.1), 2, in_flight=1))
    driver = run.start("--outage-limit", "60")
    trial_process_started(url)
    snapshot_redis.fail_snapshots()
    time.sleep(REFUSING_FOR_S)  # the outage's length is the scenario: no state to wait on
    snapshot_redis.heal()
    try:
        _, err = driver.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        driver.kill()
        _, err = driver.communicate()
        raise AssertionError(err) from None

    assert driver.returncode == 0, err
    assert "Traceback" not in err, err
    assert_clean(run.judge(f"Redis refusing writes (MISCONF) for {REFUSING_FOR_S:g} s", 2))
