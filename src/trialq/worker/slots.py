"""Trial slots: where a worker's trials run, one trial process per slot at a time.

A worker has as many slots as trials it runs at once (Celery's concurrency). Its pool forks
spare processes beyond them, so a trial can start in a process that is already up; the slot
is what keeps that trial waiting until its predecessor's process has exited entirely, so the
device is clean when it starts and no two trials of a worker ever share it.

The protocol is a lock file per slot, created by the worker's parent before it forks and held
by a trial process for its whole life. No Celery here: the worker's parent
(`trialq.worker.WorkerState`) opens them as its pool starts and removes them as it stops, and
each trial process claims one (`trialq.worker.child`). A slot is a small value
(`TrialSlot`): what it gives its trial, a share of the worker's GPUs (`GpuShare`: which GPUs,
the memory budget on each), rides on it, so whichever process claims the slot runs its trial
on that share.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from trialq.gpu.share import GpuShare

logger = logging.getLogger("trialq.pool")  # the name log lines show; kept when the module moved

SLOT_WAIT_S = 60.0
"""How long a trial waits for its predecessor's process to exit before it runs anyway."""

POLL_S = 0.001
"""Polling step while waiting for a slot, or for the parent to read a finished trial's result."""


@dataclass(frozen=True)
class TrialSlot:
    """One of a worker's trial slots: its number, the lock file its holder keeps, and the
    share of the worker's GPUs its trials get (None: a worker without `--gpus`)."""

    index: int
    lock_file: Path
    gpu: GpuShare | None = None

    @classmethod
    def in_folder(cls, directory: Path, index: int, gpu: GpuShare | None = None) -> TrialSlot:
        """Slot `index` of the slots kept in `directory`."""
        return cls(index, directory / f"slot{index}", gpu)


@dataclass(frozen=True)
class SlotHolder:
    """The process that signed a slot's lock file last: pid 0 for a slot nobody held."""

    pid: int
    started_at: float

    def is_gone(self) -> bool:
        """True once this process has exited (a zombie is gone enough), or is this one."""
        if not self.pid or self.pid == os.getpid() or _started_at(self.pid) != self.started_at:
            return True
        with contextlib.suppress(psutil.NoSuchProcess):
            return bool(psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE)
        return True


class TrialSlots:
    """One lock file per trial slot; a trial process holds one for as long as it lives.

    The kernel drops a process's lock while it closes its files on exit, a moment before the
    process has finished exiting (and, on a GPU, maybe before its device files are closed). So
    each holder also writes who it is into the file, and the next one waits for that process to
    be gone entirely.
    """

    def __init__(self, directory: Path, count: int, gpus: Sequence[GpuShare] = ()) -> None:
        """`gpus`: slot i's share is `gpus[i]`; slots beyond them get none."""
        self.directory = directory
        self.count = count
        self.slots = tuple(
            TrialSlot.in_folder(directory, index, gpus[index] if index < len(gpus) else None)
            for index in range(count)
        )
        self.held: TrialSlot | None = None
        self._fd: int | None = None

    @classmethod
    def create(cls, count: int, gpus: Sequence[GpuShare] = ()) -> TrialSlots:
        """Make the lock files in a fresh private folder (done by the parent, before forking)."""
        slots = cls(Path(tempfile.mkdtemp(prefix="trialq-slots-")), count, gpus)
        for slot in slots.slots:
            slot.lock_file.touch()
        return slots

    def claim(self, timeout_s: float = SLOT_WAIT_S) -> bool:
        """Take a free slot for the rest of this process's life, once its previous holder is
        gone; False if that did not happen within `timeout_s`."""
        if self.held is not None:
            return True
        deadline = time.monotonic() + timeout_s
        while True:
            for slot in self.slots:
                previous = self._try_lock(slot)
                if previous is not None:
                    return _wait_until_gone(previous, deadline)
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)

    def _try_lock(self, slot: TrialSlot) -> SlotHolder | None:
        """Lock `slot` and sign it; its previous holder, or None if it is busy."""
        fd = os.open(slot.lock_file, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        self._fd, self.held = fd, slot
        # A process the trial forks shares the lock; it must not keep the slot after the trial.
        os.register_at_fork(after_in_child=self.release)
        previous = _read_holder(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {_started_at(os.getpid())}".encode(), 0)
        return previous

    def hand_over(self) -> None:
        """Give the slot up now, and let the next holder start without waiting for this
        process to be gone: for a process about to exit that holds no device state."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)  # nobody to wait for
            self.release()

    def release(self) -> None:
        """Give the slot back before this process exits (trials never do: exiting frees it)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self.held = None, None

    def remove(self) -> None:
        """Delete the lock files (the worker is stopping)."""
        shutil.rmtree(self.directory, ignore_errors=True)


def claim_for_trial(slots: TrialSlots) -> TrialSlot | None:
    """Wait until this trial may use the device, saying so when it waited long or in vain;
    the slot this process holds now (None where it runs without one)."""
    started = time.monotonic()
    try:
        claimed = slots.claim()
    except OSError as exc:  # the worker is stopping and removed its slots
        logger.warning("trial process %d: no slot to claim (%s); running anyway", os.getpid(), exc)
        return None
    if not claimed:
        logger.warning(
            "trial process %d: the previous trial's process still holds the slot after %.0f s; "
            "running anyway",
            os.getpid(),
            SLOT_WAIT_S,
        )
    waited = time.monotonic() - started
    if waited > 1.0:
        logger.info("trial process %d waited %.1f s for its slot", os.getpid(), waited)
    return slots.held


def _read_holder(fd: int) -> SlotHolder:
    try:
        pid, started = os.pread(fd, 64, 0).split()
        return SlotHolder(int(pid), float(started))
    except ValueError:
        return SlotHolder(0, 0.0)  # a fresh slot: nobody held it


def _started_at(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return -1.0


def _wait_until_gone(holder: SlotHolder, deadline: float) -> bool:
    """Wait until `holder`'s process has exited; False if it still runs at `deadline`."""
    while not holder.is_gone():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True
