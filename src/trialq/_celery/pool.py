"""The worker's process pool: Celery's prefork pool with a warm spare and prompt replacement.

Every trial runs in a process that exits after it (`worker_max_tasks_per_child=1`), so the
pool replaces a process after every trial, and Celery does that on the trial's critical path:
the next trial waits for the old child to linger and exit, for a fork, and for the new child
to report ready. Measured here, that was 0.2 s a trial at best and 5 s at worst (see
`TrialAsynPool`). This pool takes the replacement off the critical path:

- it keeps `spare_processes` forked, idle processes beyond its trial slots. The consumer's
  prefetch follows `num_processes`, which stays at the trial slots, so no more trials run at
  once than before; the next trial simply goes to a process that is already up.
- every trial holds a slot lock for the whole life of its process and takes it only once
  the previous holder's process has exited entirely, so a trial that starts in a spare
  still waits for its predecessor: the device is clean when a trial starts, and no two
  trials of a worker ever share a slot. A worker that owns GPUs (`--gpus`) gives each slot
  a share of them (`GpuShare`), which the slot's trials run on. A process that never
  initialised a device hands its slot over as soon as its result is read
  (`hand_over_trial_slot`): its exit frees nothing the next trial needs. The slots are the
  worker's (`trialq.worker.WorkerState`, which knows nothing of Celery), read from the app
  the pool was built for (`trialq._celery.lifecycle.worker_of`); this pool has it open them
  before it forks and close them when it stops.
- it reaps an exited child as soon as the child can be reaped, not at the next 5 s timer,
  and without Celery's 10 ms wait on the reaped child's pipe.
- it builds, once in the parent, the C parser that every new child would build for itself:
  Celery's process initializer sets the child's parent-death signal through billiard, which
  declares `prctl` with cffi wherever cffi is installed (cryptography brings it), and cffi's
  first declaration in a process imports pycparser and builds its tables: 70 ms of CPU a
  trial, measured (`warm_child_start`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

from billiard import pool as billiard_pool
from celery.concurrency import asynpool
from celery.concurrency.prefork import TaskPool

from trialq._celery.lifecycle import worker_of
from trialq.trial.process_group import kill_group_of
from trialq.worker.slots import POLL_S

logger = logging.getLogger("trialq.pool")  # the name log lines show; kept when the module moved

_RESULT_READ_WAIT_S = 30.0
"""How long a finished child waits for the parent to read its result (billiard's own limit)."""

_REAP_FIRST_RETRY_S = 0.002
_REAP_LAST_RETRY_S = 0.5


def hand_over_trial_slot(app: Any) -> None:
    """The trial is over and its result read: let the next trial start now, unless this
    process holds device state, which only its exit frees.

    Exiting is not quick for a process forked from a parent that imported TensorFlow: the
    kernel unmaps hundreds of megabytes (16 ms here), and billiard ends the child only once
    the parent has read its last message. A process that never initialised a device
    holds nothing the next trial must wait for. `app`: the app the pool's process was
    started for (a test's pool may have none).
    """
    worker = worker_of(app)
    if worker is not None:
        worker.state.hand_over_slot()


class TrialProcess(asynpool.Worker):  # type: ignore[misc]
    """A pool child that exits as soon as the parent has read its last result.

    billiard polls for that every 0.1 s; a child with one task to run lingers that long for
    nothing, and with a spare, the next trial waits on it (its slot lock). Celery starts each
    pool process with its app first among `initargs` (`celery.worker.components.Pool`).
    """

    def _ensure_messages_consumed(self, completed: int) -> bool:
        if not self.on_ready_counter:
            return False
        deadline = time.monotonic() + _RESULT_READ_WAIT_S
        while time.monotonic() < deadline:
            if self.on_ready_counter.value >= completed:
                hand_over_trial_slot(self.initargs[0] if self.initargs else None)
                return True
            time.sleep(POLL_S)
        logger.warning("pool child %d exits before its result was read", os.getpid())
        return False


class TrialAsynPool(asynpool.AsynPool):  # type: ignore[misc]
    """Celery's event-loop pool, replacing an exited child as soon as it can be reaped.

    Celery untracks a child when its sentinel pipe closes and replaces it if it can be
    reaped then. A dying child closes the pipe a moment before the kernel lets the parent
    reap it; when the parent looks in that moment, the child is left for the pool's 5 s
    maintenance timer. On this project's machines that happened to a third of all trials.
    """

    Worker = TrialProcess

    def _event_process_exit(self, hub: Any, proc: Any) -> None:
        kill_group_of(proc.pid)  # what a killed trial process started
        super()._event_process_exit(hub, proc)
        if proc in self._pool:
            hub.call_later(_REAP_FIRST_RETRY_S, self._reap_again, hub, proc, _REAP_FIRST_RETRY_S)

    def process_flush_queues(self, proc: Any) -> None:
        """Read what a child left in its result pipe; wait for more only from a live one.

        Celery waits 10 ms for the pipe of every child it reaps, on the event loop that reads
        results and hands out trials, and the wait always runs out: the pipe stays open in
        the parent. A reaped child wrote everything it ever will, so what is in the pipe now
        is all there is. With one process per trial, that was 10 ms of every trial.
        """
        if proc.exitcode is None:
            super().process_flush_queues(proc)
            return
        reader = proc.outq._reader
        on_state_change = self._result_handler.on_state_change
        while not reader.closed and reader.poll(0):
            try:
                message = reader.recv()
            except (OSError, EOFError):
                return
            if message is None:
                return
            on_state_change(message)

    def _reap_again(self, hub: Any, proc: Any, delay: float) -> None:
        if proc not in self._pool or self._state != billiard_pool.RUN:
            return
        self.maintain_pool()
        if proc in self._pool and delay < _REAP_LAST_RETRY_S:
            hub.call_later(delay * 2, self._reap_again, hub, proc, delay * 2)


PRCTL_DECLARATION = "int prctl (int __option, ...);"
"""billiard's declaration (`billiard.util.set_pdeathsig`), parsed in every child it starts."""


def warm_child_start() -> None:
    """Parse billiard's `prctl` declaration here, before the pool forks, so that cffi's
    parser (cached per process) is inherited built; without cffi, billiard uses ctypes and
    there is nothing to warm."""
    cffi = sys.modules.get("cffi")  # billiard.util's own test: imported by billiard, or not
    if cffi is not None:
        cffi.FFI().cdef(PRCTL_DECLARATION)


class TrialPool(TaskPool):  # type: ignore[misc]
    """`worker_pool` of trialq: prefork with spare processes and trial slots.

    `limit` (Celery's concurrency) stays the number of trial slots, and so does
    `num_processes`, from which Celery's consumer derives how many messages it reserves.
    """

    Pool = TrialAsynPool
    limit: int
    _owner_pid: int | None = None
    """The process that started the pool: the only one that may stop it."""

    def on_start(self) -> None:
        warm_child_start()
        self._owner_pid = os.getpid()
        worker = worker_of(self.app)
        slots = self.limit
        if worker is not None:
            worker.state.open_slots(slots)
        self.limit = slots + (worker.state.settings.spare_processes if worker is not None else 0)
        try:
            super().on_start()
        finally:
            self.limit = slots

    @property
    def num_processes(self) -> int:
        return self.limit

    def on_stop(self) -> None:
        if self._stopped_by_a_stranger("stop"):
            return
        super().on_stop()
        self._remove_slots()

    def on_terminate(self) -> None:
        if self._stopped_by_a_stranger("terminate"):
            return
        super().on_terminate()
        self._remove_slots()

    def _remove_slots(self) -> None:
        worker = worker_of(self.app)
        if worker is not None:
            worker.state.close_slots()

    def _stopped_by_a_stranger(self, how: str) -> bool:
        """Whether this process is not the one that started the pool, and must leave it be.

        A stop signal that reaches a process the pool has just forked, before billiard makes
        it a pool process, runs the parent's handler there: Celery's cold shutdown stops
        "its" pool from the new child. Joining the parent's processes from there fails
        (`can only join a child process`: an unrecoverable error) and removing the slots
        would take them from the worker. The parent got the signal too; it stops the pool.
        """
        if self._owner_pid in (None, os.getpid()):
            return False
        logger.warning(
            "pool %s asked of process %d, not the worker's parent: ignored", how, os.getpid()
        )
        return True
