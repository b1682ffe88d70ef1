"""A pool stopped from a process it did not start leaves it be (issue 26, item 12).

A stop signal that reached a worker while it forked its spare process ran Celery's cold
shutdown in the new child, which stopped "its" pool: billiard's `can only join a child
process`, an unrecoverable error, 7 s of shutdown instead of 2. Here that child's stop is
played out deterministically: a real `TrialPool`, stopped from a process forked off it. The
pool and its processes find the worker's slots through the app they were built for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from billiard.queues import _SimpleQueue
from celery import Celery

from trialq._celery.pool import TrialPool, TrialProcess
from trialq._celery.worker import build_worker_app
from trialq.settings import Settings
from trialq.worker.state import WorkerState

pytestmark = pytest.mark.usefixtures("no_framework_here")  # forks from this process


@pytest.fixture
def room() -> WorkerState:
    """A worker's state."""
    return WorkerState(Settings(spare_processes=1, broker_url="redis://127.0.0.1:1/0"))


@pytest.fixture
def started_pool(room: WorkerState) -> Iterator[TrialPool]:
    """A pool built for the app that runs `room`, which it reads its slots from."""
    app: Celery = build_worker_app(room)
    pool = TrialPool(limit=1, app=app, initargs=(app, "pool-shutdown@test"))
    pool.start()
    yield pool
    pool.stop()


def _in_a_forked_child(action: str, pool: TrialPool) -> int:
    """Run `pool.<action>()` in a process forked off this one (as the spare's child was);
    its exit status: 0 done, 3 billiard's assertion, 4 anything else."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            getattr(pool, action)()
        except AssertionError:
            code = 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.parametrize("action", ["stop", "terminate"])
def test_a_pool_stopped_from_a_forked_child_is_left_to_its_parent(
    started_pool: TrialPool, room: WorkerState, action: str
) -> None:
    processes = list(started_pool._pool._pool)
    slots = room.slots
    assert slots is not None and len(processes) == 2  # one trial slot, one spare

    assert _in_a_forked_child(action, started_pool) == 0

    assert slots.directory.is_dir(), "the child removed the worker's trial slots"
    assert all(p.exitcode is None for p in processes), "the child stopped the parent's processes"
    started_pool.stop()  # the parent, as ever
    assert room.slots is None and not slots.directory.exists()


def test_a_trial_process_hands_its_slot_over_through_the_app_it_was_started_for(
    room: WorkerState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool process finds the worker's slots through the app Celery starts it with (the
    first of its `initargs`); one started for an app that runs no worker hands nothing."""
    handed: list[bool] = []
    monkeypatch.setattr(room, "hand_over_slot", lambda: handed.append(True))
    read = SimpleNamespace(value=1)  # the parent has read the process's one result
    for initargs, expected in [
        ((Celery("other"), "h"), []),
        ((build_worker_app(room), "h"), [True]),
    ]:
        process = TrialProcess(
            _SimpleQueue(), _SimpleQueue(), initargs=initargs, on_ready_counter=read
        )
        assert process._ensure_messages_consumed(completed=1)
        assert handed == expected
