"""An attempt the driver gave up on is ended by its own trial process (issue 26.3): the
beacon reads `trialq:kill:<task id>` at each renewal and ends the process group, whatever
the worker's parent does. On the real Redis, with a real process and its child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import redis
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.settings import Settings
from trialq.wire.keys import attempt_key, kill_key, withdrawn_key

TRIAL_PROCESS = textwrap.dedent(
    """
    import os, subprocess, sys, time
    import redis
    from trialq.trial.process_group import kill_own_group, lead_own_group
    from trialq.wire.heartbeat import RunningTrial, TrialBeacon

    lead_own_group()
    child = subprocess.Popen(["sleep", "600"])
    claim = RunningTrial("w@host", "study", 0, 1, "task-1", os.getpid(), time.time())
    client = redis.Redis.from_url(sys.argv[1])
    TrialBeacon(client, claim, interval_s=0.1, ttl_s=3, on_kill=kill_own_group).start()
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def test_the_beacon_ends_its_process_group_once_the_attempt_is_marked_killed(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    process = subprocess.Popen(
        [sys.executable, "-c", TRIAL_PROCESS, redis_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        child = psutil.Process(int(process.stdout.readline()))
        wait_until(lambda: client.exists(attempt_key("task-1")), 10, "the beacon to beat")
        client.set(kill_key("task-1"), 1)
        assert process.wait(timeout=30) == -signal.SIGKILL
        wait_until(lambda: not _alive(child), 30, "the trial's child to be gone")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def test_terminate_marks_the_attempt_killed_and_withdraw_does_not(redis_url: str) -> None:
    """A task withdrawn before it ran is sent again, never killed: its mark is apart."""
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url, key_ttl_s=90))
    dispatcher.withdraw(["queued"], "gpu")
    dispatcher.terminate("given-up")
    client = redis.Redis.from_url(redis_url)
    assert client.exists(withdrawn_key("queued")) and not client.exists(kill_key("queued"))
    assert 85_000 < client.pttl(kill_key("given-up")) <= 90_000


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
