"""Trial slots: a trial process holds one for its whole life, and only it does."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.synchronize
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from billiard.queues import _SimpleQueue
from celery.concurrency import asynpool
from waiting import wait_until

from trialq._celery.pool import TrialAsynPool
from trialq.worker.slots import TrialSlots

pytestmark = pytest.mark.usefixtures("no_framework_here")  # forks from this process


def _hold_slot(
    directory: str,
    count: int,
    held: multiprocessing.synchronize.Event,
    release: multiprocessing.synchronize.Event,
) -> None:
    slots = TrialSlots(Path(directory), count)
    assert slots.claim(timeout_s=5)
    held.set()
    release.wait(30)  # until the test has seen the slot taken


def test_a_slot_is_held_until_its_process_exits(tmp_path: Path) -> None:
    slots = TrialSlots.create(1)
    try:
        held, release = multiprocessing.Event(), multiprocessing.Event()
        args = (slots.directory, 1, held, release)
        holder = multiprocessing.Process(target=_hold_slot, args=args)
        holder.start()
        assert held.wait(10)
        other = TrialSlots(slots.directory, 1)
        assert not other.claim(timeout_s=0.2), "two processes held one slot"
        release.set()
        assert other.claim(timeout_s=10), "the slot was not freed when its holder exited"
        assert not holder.is_alive()
        other.release()
    finally:
        slots.remove()


def _hold_slot_and_fork(directory: str, pipe: multiprocessing.connection.Connection) -> None:
    slots = TrialSlots(Path(directory), 1)
    assert slots.claim(timeout_s=5)
    grandchild = os.fork()
    if grandchild == 0:  # outlives the trial process, as a leaked helper process would
        time.sleep(30)  # the test kills it once it has looked
        os._exit(0)
    pipe.send(grandchild)


def test_a_process_forked_by_a_trial_does_not_keep_its_slot(tmp_path: Path) -> None:
    slots = TrialSlots.create(1)
    receiver, sender = multiprocessing.Pipe(duplex=False)
    try:
        trial = multiprocessing.Process(target=_hold_slot_and_fork, args=(slots.directory, sender))
        trial.start()
        grandchild = receiver.recv()
        trial.join()
        after = TrialSlots(slots.directory, 1)
        assert after.claim(timeout_s=2), "the grandchild kept the slot"
        os.kill(grandchild, 0)  # still alive: the slot was freed by the trial's exit alone
        os.kill(grandchild, signal.SIGKILL)
        after.release()
    finally:
        slots.remove()


def test_every_slot_of_a_worker_can_be_held_at_once() -> None:
    slots = TrialSlots.create(2)
    try:
        first, second, third = (TrialSlots(slots.directory, 2) for _ in range(3))
        assert first.claim(timeout_s=1) and second.claim(timeout_s=1)
        assert not third.claim(timeout_s=0.1)
        first.release()
        assert third.claim(timeout_s=1)
        second.release()
        third.release()
    finally:
        slots.remove()


def _sign_slot_for(slots: TrialSlots, process: subprocess.Popen[bytes]) -> None:
    started = psutil.Process(process.pid).create_time()
    (slots.directory / "slot0").write_text(f"{process.pid} {started}")


def test_a_slot_waits_until_its_previous_holder_has_exited_entirely() -> None:
    slots = TrialSlots.create(1)
    holder = subprocess.Popen(["sleep", "30"])
    try:
        _sign_slot_for(slots, holder)  # its lock is gone, the process is not (it is exiting)
        waiting = TrialSlots(slots.directory, 1)
        assert not waiting.claim(timeout_s=0.3), "claimed while the previous holder ran"
        waiting.release()
        _sign_slot_for(slots, holder)
        holder.kill()
        zombie = psutil.STATUS_ZOMBIE
        wait_until(lambda: psutil.Process(holder.pid).status() == zombie, 10, "a zombie", 0.01)
        after = TrialSlots(slots.directory, 1)
        assert after.claim(timeout_s=5), "a zombie (exited, not yet reaped) still blocked"
        after.release()
    finally:
        holder.kill()
        holder.wait()
        slots.remove()


def _leave_results(outq: _SimpleQueue) -> None:
    outq._writer.send(("ACK", 1))
    outq._writer.send(("READY", 1))


def test_a_reaped_childs_last_messages_are_read_without_waiting_for_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery waits on the pipe of every reaped child for more; none can come from it."""
    outq = _SimpleQueue(rnonblock=True)  # as Celery makes them; the parent keeps both ends
    child = multiprocessing.get_context("fork").Process(target=_leave_results, args=(outq,))
    child.start()
    child.join()
    received: list[object] = []
    pool = SimpleNamespace(_result_handler=SimpleNamespace(on_state_change=received.append))
    proc = SimpleNamespace(exitcode=child.exitcode, outq=outq)

    def waits(*args: object, **kwargs: object) -> None:
        raise AssertionError("waited on a reaped child's pipe")

    monkeypatch.setattr(asynpool, "_select", waits)
    TrialAsynPool.process_flush_queues(pool, proc)  # type: ignore[arg-type]

    assert received == [("ACK", 1), ("READY", 1)]
    assert not outq._reader.poll(0)


def _hand_over_then_linger(directory: str, handed: multiprocessing.synchronize.Event) -> None:
    slots = TrialSlots(Path(directory), 1)
    assert slots.claim(timeout_s=5)
    slots.hand_over()
    handed.set()
    time.sleep(30)  # still alive, as a process tearing down its memory is


def test_a_handed_over_slot_is_taken_while_its_holder_still_lives() -> None:
    slots = TrialSlots.create(1)
    handed = multiprocessing.Event()
    holder = multiprocessing.Process(target=_hand_over_then_linger, args=(slots.directory, handed))
    holder.start()
    try:
        assert handed.wait(10)
        after = TrialSlots(slots.directory, 1)
        assert after.claim(timeout_s=2), "waited for a holder that handed its slot over"
        assert holder.is_alive()
        after.release()
    finally:
        holder.kill()
        holder.join()
        slots.remove()
