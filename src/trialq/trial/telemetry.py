"""GPU telemetry: what a trial's device did while it ran, and whether it was clean to start.

Both read only the `Device` seam, so CPU tests drive them with `FakeDevice`. Memory in use
is the driver's view of the whole device (every process on it, CUDA contexts included):
with one worker per GPU and one trial at a time, that is the trial's own footprint, and
anything left above the worker's starting point once a trial process is gone was left by
a process that outlived its trial.

A worker that packs trials onto its GPUs (`trialq worker --gpus`) cannot read a device's
total that way: its neighbours' memory is there by right. Its check (`NeighbourCheck`) reads
NVML's processes on each of the trial's GPUs and refuses a GPU that a process holds which
is none of this worker's live trial processes (nor one of theirs): a process a finished
trial left behind, or anything else that is not the worker's.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from statistics import fmean
from types import TracebackType

import psutil

from trialq.trial.device import Device
from trialq.trial.gpu_inventory import Nvml
from trialq.trial.gpu_share import GpuShare

SAMPLE_INTERVAL_S = 0.5
"""How often the trial process reads its device; NVML's own utilisation window is ~1/6 s
to 1 s, so sampling faster would mostly read the same value again."""

SETTLE_S = 5.0
"""How long a new trial process waits for its device to come back to baseline before it
refuses: the driver may still be tearing down the previous trial's process."""

MIB = 2**20


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


@dataclass(frozen=True)
class NeighbourCheck:
    """Whether a trial's GPUs are clean to start on, per GPU, knowing its neighbours: no
    process holds more than `tolerance_bytes` on them unless it is one of this worker's live
    trial processes or their children (`worker_tree`, read in the trial process)."""

    tolerance_bytes: int
    settle_s: float = SETTLE_S

    def refusal(
        self, nvml: Nvml, share: GpuShare, worker_tree: Callable[[], set[int]] | None = None
    ) -> str | None:
        """Why the trial may not start on its GPUs now, or None; a stranger that goes within
        `settle_s` (a finished trial's process still exiting) is waited for."""
        deadline = time.monotonic() + self.settle_s
        tree = worker_tree or worker_processes
        strangers = self._strangers(nvml, share, tree())
        while strangers and time.monotonic() < deadline:
            time.sleep(min(0.25, self.settle_s))
            strangers = self._strangers(nvml, share, tree())
        if not strangers:
            return None
        held = ", ".join(
            f"pid {pid} holds {_mib(used)} on GPU {gpu}" for gpu, pid, used in strangers
        )
        return (
            f"GPU not clean: {held}, and is none of this worker's trial processes (a process "
            "an earlier trial left behind?); the trial was not run"
        )

    def _strangers(self, nvml: Nvml, share: GpuShare, tree: set[int]) -> list[tuple[str, int, int]]:
        found = []
        for gpu in share.devices:
            for pid, used in sorted(nvml.processes(gpu).items()):
                if pid not in tree and used > self.tolerance_bytes:
                    found.append((gpu, pid, used))
        return found


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
