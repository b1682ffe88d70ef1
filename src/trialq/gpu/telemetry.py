"""GPU telemetry: what a trial's device did while it ran, and whether it was clean to start.

Both read only the `Device` seam, so CPU tests drive them with `FakeDevice`. Memory in use
is the driver's view of the whole device (every process on it, CUDA contexts included):
with one worker per GPU and one trial at a time, that is the trial's own footprint, and
anything left above the worker's starting point once a trial process is gone was left by
a process that outlived its trial.

A worker that packs trials onto its GPUs (`trialq worker --gpus`) cannot read a device's
total that way: its neighbours' memory is there by right. Its check (`NeighbourCheck`) reads
NVML's processes on each of the trial's GPUs and refuses a GPU only on evidence that a
process holding it is this worker's and none of its live trial processes: one that carries
the worker's mark (`TrialMarks`: its environment marker, or a file of its slots folder held
open) outside the live trial tree, a process a finished trial left behind. Any other memory
(a second worker started from the same shell, a notebook, another pod's, an MPS server's, or
any where NVML names no process of this worker) is unattributed: waited on, then noted, and
the worker never stops taking trials for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from types import TracebackType
from typing import TypeVar

import psutil

from trialq.gpu.attribution import ProcessView, Reading, Stranger, shortfall, strangers
from trialq.gpu.device import Device
from trialq.gpu.inventory import Nvml
from trialq.gpu.once_per_worker import OncePerWorker
from trialq.gpu.share import GpuShare

SAMPLE_INTERVAL_S = 0.5
"""How often the trial process reads its device; NVML's own utilisation window is ~1/6 s
to 1 s, so sampling faster would mostly read the same value again."""

SETTLE_S = 5.0
"""How long a new trial process waits for its device to come back to baseline before it
refuses: the driver may still be tearing down the previous trial's process."""

MIB = 2**20

_log = logging.getLogger("trialq.gpu")
_T = TypeVar("_T")


@dataclass(frozen=True)
class GpuTelemetry:
    """A trial's device readings, None where the device gave none (no GPU, no NVML)."""

    memory_used_peak_bytes: int | None = None
    utilization_mean: float | None = None


class Sampler:
    """Reads the device from a daemon thread of the trial process while the trial runs."""

    def __init__(self, device: Device, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._device = device
        self._interval_s = interval_s
        self._used: list[int] = []
        self._utilization: list[float] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trialq-telemetry", daemon=True)

    def __enter__(self) -> Sampler:
        """Start sampling, unless the device has nothing to say (then no thread at all)."""
        if self._device.memory_used_bytes() is not None:
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop, then take a last reading so a trial shorter than one interval has one."""
        if self._thread.is_alive():
            self._stopped.set()
            self._thread.join()
            self._sample()

    def result(self) -> GpuTelemetry:
        """The peak memory in use and the mean utilisation over the samples taken."""
        return GpuTelemetry(
            memory_used_peak_bytes=max(self._used) if self._used else None,
            utilization_mean=round(fmean(self._utilization), 2) if self._utilization else None,
        )

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._sample()

    def _sample(self) -> None:
        """One reading; a device that stops answering leaves gaps, not a failed trial."""
        try:
            used, busy = self._device.memory_used_bytes(), self._device.utilization_percent()
        except Exception:
            return
        if used is not None:
            self._used.append(used)
        if busy is not None:
            self._utilization.append(busy)


@dataclass(frozen=True)
class DeviceBaseline:
    """The memory in use on a worker's device when the worker started: a clean device."""

    used_bytes: int
    tolerance_bytes: int
    settle_s: float = SETTLE_S

    @classmethod
    def measure(
        cls, device: Device, tolerance_bytes: int, settle_s: float = SETTLE_S
    ) -> DeviceBaseline | None:
        """Read it now, in the worker's parent before any trial, and let go of the device."""
        try:
            used = device.memory_used_bytes()
            return None if used is None else cls(used, tolerance_bytes, settle_s)
        finally:
            device.close()

    def refusal(self, device: Device) -> str | None:
        """Why no trial may start on the device now, or None when it is back to baseline."""
        used = self._settled(device)
        if used is None or used <= self.used_bytes + self.tolerance_bytes:
            return None
        return (
            f"device {device.name} still holds {_mib(used - self.used_bytes)} more than when "
            f"the worker started ({_mib(used)} in use, baseline {_mib(self.used_bytes)}, "
            f"tolerance {_mib(self.tolerance_bytes)}): a process of an earlier trial may still "
            "hold it; the trial was not run"
        )

    def _settled(self, device: Device) -> int | None:
        """Memory in use once back within tolerance, or the last reading after `settle_s`."""
        deadline = time.monotonic() + self.settle_s
        used = device.memory_used_bytes()
        while used is not None and used > self.used_bytes + self.tolerance_bytes:
            if time.monotonic() >= deadline:
                break
            time.sleep(min(0.25, self.settle_s))
            used = device.memory_used_bytes()
        return used


WORKER_MARK = "TRIALQ_WORKER_MARK"
"""The environment variable a worker with `--gpus` sets for everything it starts: a
process that carries its value is of this worker, by inheritance (a trial's subprocesses
among them)."""


@dataclass(frozen=True)
class TrialMarks:
    """The evidence that a process is of this worker: its mark in the process's environment
    (what a process started with `exec` carries), or a file of its slots folder held open
    (what a forked process inherits: a trial's slot lock). None of each: no such evidence."""

    mark: str | None = None
    folder: Path | None = None

    @classmethod
    def here(cls, folder: Path | None) -> TrialMarks:
        """This process's worker's marks (from the environment it inherited)."""
        return cls(os.environ.get(WORKER_MARK) or None, folder)

    def carried_by(self, pid: int) -> bool:
        """Whether `pid` (of this PID namespace) carries either mark."""
        return self._in_environment(pid) or self._holds_a_slot_file(pid)

    def _in_environment(self, pid: int) -> bool:
        if not self.mark:
            return False
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, another namespace's, or not ours to read: no evidence
            return False
        return f"{WORKER_MARK}={self.mark}".encode() in environ.split(b"\0")

    def _holds_a_slot_file(self, pid: int) -> bool:
        if self.folder is None:
            return False
        folder = str(self.folder.resolve())
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            return False
        return any(link.startswith(folder + os.sep) for link in links)


@dataclass(frozen=True)
class StartCheck:
    """The start check's verdict: a refusal (the trial does not run), or a run with a note
    of what it could not attribute or read (None: clean)."""

    refusal: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class NeighbourCheck:
    """Whether a trial's GPUs are clean to start on, per GPU, knowing its neighbours
    (`trialq.gpu.attribution`, docs/oom.md): a process carrying this worker's marks (`marks`)
    that is none of its live trial processes or their children (`worker_tree`, read in the
    trial process) and holds more than `tolerance_bytes` is refused for, where NVML names this
    namespace's processes; any other memory is unattributed: waited on, then noted."""

    tolerance_bytes: int
    settle_s: float = SETTLE_S
    view: ProcessView = ProcessView.UNKNOWN
    context_bytes: int = 0
    unattributed_wait_s: float = SETTLE_S
    warnings: OncePerWorker | None = None
    marks: TrialMarks = field(default_factory=TrialMarks)

    def check(
        self, nvml: Nvml, share: GpuShare, worker_tree: Callable[[], set[int]] | None = None
    ) -> StartCheck:
        """Refuse for a stranger still there after `settle_s` (a finished trial's process
        still exiting is waited for); run, with a note, once memory nobody can be named for
        has held part of the trial's share for `unattributed_wait_s`."""
        started = time.monotonic()
        tree = worker_tree or worker_processes
        while True:
            try:
                look = self._look(nvml, share, tree())
            except Exception as exc:  # whatever a reading raised: unchecked, never a failure
                return StartCheck(note=self._unchecked(exc))
            waited = time.monotonic() - started
            if not look.strangers and not look.short:
                return StartCheck(note=look.failed)
            if look.strangers and waited >= self.settle_s:
                return StartCheck(refusal=_refusal(look.strangers))
            if not look.strangers and waited >= self.unattributed_wait_s:
                return StartCheck(note=_joined(_short_note(look.short, share, waited), look.failed))
            time.sleep(min(0.25, self.settle_s, self.unattributed_wait_s) or 0.01)

    def refusal(
        self, nvml: Nvml, share: GpuShare, worker_tree: Callable[[], set[int]] | None = None
    ) -> str | None:
        """Why the trial may not start on its GPUs now, or None (`check`'s refusal)."""
        return self.check(nvml, share, worker_tree).refusal

    def _unchecked(self, exc: Exception) -> str:
        text = f"GPU start check failed ({type(exc).__name__}: {exc})"
        (self.warnings or OncePerWorker(_log)).warn(
            f"start-{type(exc).__name__}", f"{text}; trials run"
        )
        return f"{text}: started unchecked"

    def _look(self, nvml: Nvml, share: GpuShare, tree: set[int]) -> _Look:
        limit = None if share.budget_bytes is None else share.budget_bytes + self.context_bytes
        look = _Look()
        for gpu in share.devices:
            listed = self._try(look, gpu, "processes", nvml.processes)
            used = self._try(look, gpu, "memory", nvml.used_bytes)
            reading = Reading(listed, used)
            look.strangers += strangers(
                self.view, gpu, listed, tree, self.tolerance_bytes, self.marks.carried_by
            )
            lacking = shortfall(reading, share.total_bytes, limit, self.tolerance_bytes)
            if lacking:
                look.short[gpu] = lacking
        return look

    def _try(self, look: _Look, gpu: str, what: str, read: Callable[[str], _T]) -> _T | None:
        try:
            return read(gpu)
        except Exception as exc:  # NVMLError and kin: that part goes unchecked, with a note
            if what == "processes" and self.view is ProcessView.NO_PROCESSES:
                return None  # known at the worker's start: nothing to say per trial
            text = f"NVML failed on GPU {gpu} ({what}: {type(exc).__name__}: {exc})"
            look.failed = _joined(look.failed, f"start check incomplete: {text}")
            (self.warnings or OncePerWorker(_log)).warn(
                f"start-{what}-{type(exc).__name__}", f"GPU start check: {text}; trials run"
            )
            return None


@dataclass
class _Look:
    """One look at a trial's GPUs: strangers, the share others hold per GPU, NVML failures."""

    strangers: list[Stranger] = field(default_factory=list)
    short: dict[str, int] = field(default_factory=dict)
    failed: str | None = None


def _refusal(found: list[Stranger]) -> str:
    held = ", ".join(stranger.text() for stranger in found)
    return (
        f"GPU not clean: {held}, and carries this worker's mark but is none of its live "
        "trial processes (a process an earlier trial left behind); the trial was not run"
    )


def _short_note(short: dict[str, int], share: GpuShare, waited: float) -> str:
    held = ", ".join(f"{_mib(n)} on GPU {gpu}" for gpu, n in short.items())
    return (
        f"started after waiting {waited:.0f} s with part of its share held by memory this "
        f"worker cannot attribute to a process ({held}; budget "
        f"{_mib(share.budget_bytes or 0)} each): a neighbour's OOM can follow"
    )


def _joined(*notes: str | None) -> str | None:
    return "; ".join(note for note in notes if note) or None


def worker_processes() -> set[int]:
    """This trial process's worker's live trial processes and everything they started: the
    worker parent's descendants (this process among them)."""
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        parent = psutil.Process(os.getppid())
        pids.update(child.pid for child in parent.children(recursive=True))
    return pids


def _mib(n_bytes: int) -> str:
    return f"{n_bytes / MIB:.0f} MiB"
