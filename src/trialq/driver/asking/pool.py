"""The driver's side of the ask processes: starting them, keeping their copies of the study
current, taking what they drew, and adopting it as a new trial of the study.

Each pass (`StudyDriver._pause`, once the sends are out) hands every process the trials that
changed and asks for more draws, so that up to `READY_PER_PROCESS` each are ready or coming.
The driver's next ask takes the oldest ready draw; where none is ready (the processes are
behind, or gone) the driver asks itself, as it does without them: an ask process that fails
never stops or stalls the run. What the processes are told goes through a writer thread each, so
a process that stops reading never blocks the loop; one that has drawn nothing for
`SILENT_LIMIT_S` while draws were wanted is stopped. Where a draw came from is the only
difference in the study: an adopted trial is a new trial with those params, told like any.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import optuna

from trialq.driver._storage.store import TrialStore
from trialq.driver.asking.changes import ChangeFeed
from trialq.driver.asking.protocol import Asked, AskFor, Changes, Failed, Start
from trialq.spec import StudySpec

_log = logging.getLogger("trialq.driver")

READY_PER_PROCESS = 4
"""Draws kept ready or coming, per process: enough for the trials a pass tells at a hundred
a second, few enough that a draw is at most a few passes older than the study it fills."""

SILENT_LIMIT_S = 60.0
"""How long a process may draw nothing while draws are wanted before it is stopped (a TPE
draw takes milliseconds; a define-by-run space that hangs would hang it for good)."""

CLOSE_WAIT_S = 2.0
"""How long a process is given to end when the run does, before it is killed."""

_END_WRITER = object()


@dataclass
class _AskProcess:
    index: int
    process: subprocess.Popen[bytes]
    conn: Connection
    outbox: queue.SimpleQueue[Any]
    writer: threading.Thread
    coming: int = 0
    """Draws asked of it, not yet received."""
    settled: list[int] = field(default_factory=list)
    """Its draws the driver is done with, said with the next changes."""
    heard_at: float = 0.0
    alive: bool = True


class AskPool:
    """`processes` ask processes for `study`, started now with its trials so far."""

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        processes: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._feed = ChangeFeed()
        trials = self._feed.changes(study)
        seed = spec.study.sampler_args.get("seed")
        self._processes: list[_AskProcess] = []
        self._ready: deque[tuple[_AskProcess, Asked]] = deque()
        try:
            for i in range(processes):
                start = Start(spec, None if seed is None else seed + 1 + i, trials)
                self._processes.append(_start(i, start, clock()))
        except BaseException:  # none left behind by a pool that never was
            self.close()
            raise
        self.drawn = 0
        """Trials whose params an ask process drew."""

    @property
    def ready(self) -> int:
        """Draws received and not yet taken."""
        return len(self._ready)

    def sync(self, study: optuna.Study, left: int) -> None:
        """Hand every process the study's changes, take in what they drew, and ask for more
        until `left` draws (the trials the run may still ask; 0: none) are ready or coming,
        at most `READY_PER_PROCESS` a live process."""
        changes = self._feed.changes(study)
        for process in self._live():
            if changes or process.settled:
                process.outbox.put(Changes(changes, process.settled))
                process.settled = []
        self._receive()
        live = self._live()
        coming = len(self._ready) + sum(p.coming for p in live)
        wanted = min(left, READY_PER_PROCESS * len(live)) - coming
        asks = dict.fromkeys((p.index for p in live), 0)
        for _ in range(max(0, wanted)):
            least = min(live, key=lambda p: p.coming)
            if least.coming == 0:  # its silence counts from now: it was not asked before
                least.heard_at = self._clock()
            least.coming += 1
            asks[least.index] += 1
        for process in live:
            if asks[process.index]:
                process.outbox.put(AskFor(asks[process.index]))

    def take(self, study: optuna.Study, store: TrialStore) -> optuna.Trial | None:
        """The oldest ready draw as a new trial of `study`, written through `store`; None
        where none is ready."""
        self._receive()
        if not self._ready:
            return None
        process, asked = self._ready.popleft()
        process.settled.append(asked.ask_id)
        self.drawn += 1
        return store.adopt(asked.params, asked.distributions)

    def close(self) -> None:
        """End every process (killed where it does not end within `CLOSE_WAIT_S`)."""
        self._ready.clear()
        for process in self._processes:
            process.outbox.put(None)
            process.outbox.put(_END_WRITER)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for process in self._processes:
            try:
                process.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.process.kill()
                process.process.wait()
            process.conn.close()
            process.alive = False

    def _live(self) -> list[_AskProcess]:
        return [p for p in self._processes if p.alive]

    def _receive(self) -> None:
        now = self._clock()
        for process in self._live():
            try:
                while process.conn.poll(0):
                    message = process.conn.recv()
                    process.heard_at = now
                    if isinstance(message, Asked):
                        process.coming -= 1
                        self._ready.append((process, message))
                    elif isinstance(message, Failed):
                        self._lose(process, message.reason)
                        break
            except (EOFError, OSError):
                self._lose(process, f"it ended, exit code {process.process.poll()}")
                continue
            if process.alive and process.coming and now - process.heard_at > SILENT_LIMIT_S:
                self._lose(process, f"it drew nothing for {SILENT_LIMIT_S:.0f} s; stopped")

    def _lose(self, process: _AskProcess, reason: str) -> None:
        """Take `process` out for the rest of the run: its draws not taken are dropped."""
        process.alive = False
        process.process.kill()
        process.outbox.put(_END_WRITER)
        self._ready = deque((p, a) for p, a in self._ready if p is not process)
        _log.warning(
            "ask process %d stopped (%s): the driver asks in its place", process.index, reason
        )


def _start(index: int, start: Start, now: float) -> _AskProcess:
    """One ask process, told `start` (through its writer, like everything after)."""
    ours, theirs = socket.socketpair()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", "trialq.driver.asking.asker", str(theirs.fileno())]
    process = subprocess.Popen(
        command, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env
    )
    theirs.close()
    conn = Connection(ours.detach())
    outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    writer = threading.Thread(
        target=_write, args=(conn, outbox), name=f"trialq-ask-{index}", daemon=True
    )
    writer.start()
    outbox.put(start)
    return _AskProcess(index, process, conn, outbox, writer, heard_at=now)


def _write(conn: Connection, outbox: queue.SimpleQueue[Any]) -> None:
    """Send what the driver put in `outbox`, in order, until told to end or the process is gone."""
    while (message := outbox.get()) is not _END_WRITER:
        try:
            conn.send(message)
        except OSError:
            return
