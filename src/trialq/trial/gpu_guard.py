"""The GPU memory cap of a trial process that shares its GPUs (`trialq worker --gpus`).

Like the host-memory guard (`trialq.trial.memory_guard`), a thread samples what the trial
holds on each of its GPUs. Past its share (its budget plus one CUDA context) it leaves word and
kills its own process at once, so the trial ends `oom` and its neighbours on the GPU run on: a
framework's cap can be bypassed (a second framework, a CUDA library's own pool), NVML's count
cannot.

What the trial holds is NVML's figure for its process tree where NVML names the worker's
processes with their memory, else its framework allocator's figure plus one CUDA context
(`trialq.gpu.attribution`, which also says what each NVML family leaves out); with
neither, the GPU is unguarded, and the trial's result says so (`accounting_note`).

It also tells a trial's own out-of-memory error from one a neighbour caused: while sampling
it notes when the others on a GPU (the device's memory in use less the trial's own) held more
than the card less this trial's share. A trial that ran out of memory within its own share,
with the others inside its share lately or now, was crowded out (`neighbour_caused`): the
driver sends it again and the sampler never hears of it. Without a figure of its own, an OOM
stays the trial's own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import psutil

from trialq.gpu.attribution import (
    Own,
    ProcessView,
    Reading,
    Source,
    crowded,
    others_memory,
    own_memory,
)
from trialq.gpu.inventory import Nvml
from trialq.gpu.once_per_worker import OncePerWorker
from trialq.gpu.share import GpuShare
from trialq.trial.frameworks.session import allocator_peaks

SAMPLE_INTERVAL_S = 0.05
CROWDED_WINDOW_S = 10.0
"""How recently the others must have been inside this trial's share for its OOM to be theirs."""

MIB = 2**20

AllocatorFigure = Callable[[int, str], "int | None"]
"""The trial's framework figure on its GPU at a position of its share (CUDA's order)."""

_log = logging.getLogger("trialq.gpu")
_T = TypeVar("_T")


@dataclass(frozen=True)
class GpuOverrun:
    """A trial past its share of a GPU: which GPU, what it held, and what it may hold."""

    device: str
    used_bytes: int
    limit_bytes: int

    def text(self) -> str:
        """The trial's error, as its result carries it."""
        return (
            f"GPU out of memory: the trial held {self.used_bytes // MIB} MiB on GPU "
            f"{self.device}, over its share of {self.limit_bytes // MIB} MiB (its budget plus "
            "one CUDA context); ended by trialq's GPU memory guard"
        )


def framework_figure(nvml: Nvml) -> AllocatorFigure:
    """The trial's framework allocator's peak on a GPU; a fake NVML's stand-in where no
    framework has one (tests/fake_nvml.py: a real NVML has none)."""

    def read(position: int, device: str) -> int | None:
        peaks = allocator_peaks()
        if peaks is not None and position < len(peaks):
            return peaks[position]
        return nvml.allocator_stand_in(device)

    return read


class GpuGuard:
    """Samples the trial's memory on its GPUs; past `share`'s budget plus `context_bytes`,
    calls `on_exceeded` and SIGKILLs this process."""

    def __init__(
        self,
        nvml: Nvml,
        share: GpuShare,
        context_bytes: int,
        on_exceeded: Callable[[GpuOverrun], None],
        view: ProcessView = ProcessView.UNKNOWN,
        allocator: AllocatorFigure | None = None,
        warnings: OncePerWorker | None = None,
    ) -> None:
        self._nvml = nvml
        self._share = share
        self._context = context_bytes
        self._limit = None if share.budget_bytes is None else share.budget_bytes + context_bytes
        self._on_exceeded = on_exceeded
        self._view = view
        self._allocator = allocator if allocator is not None else framework_figure(nvml)
        self._warnings = warnings or OncePerWorker(_log)
        self._peaks: dict[str, int] = {}
        self._sources: dict[str, Source] = {}
        self._errors: dict[str, str] = {}
        self._crowded_at: float | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trialq-gpu-guard", daemon=True)

    def __enter__(self) -> GpuGuard:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=1)

    def peaks(self) -> dict[str, int]:
        """The most the trial held on each of its GPUs while sampled (where it was known)."""
        return dict(self._peaks)

    def accounting(self) -> str:
        """Where the trial's own figures came from: one source, or one per GPU."""
        sources = {d: self._sources.get(d, Source.NONE) for d in self._share.devices}
        if len(set(sources.values())) == 1:
            return str(next(iter(sources.values())))
        return ", ".join(f"GPU {d}: {source}" for d, source in sources.items())

    def accounting_note(self) -> str | None:
        """What the guard could not do, in words (None: it guarded every GPU throughout)."""
        notes = [
            f"GPU {d} unguarded: no figure of the trial's own memory ({self._why_none(d)})"
            for d in self._share.devices
            if self._sources.get(d, Source.NONE) is Source.NONE
        ]
        notes += [f"NVML failed on GPU {d}: {error}" for d, error in self._errors.items()]
        return "; ".join(notes) or None

    def neighbour_caused(self) -> bool:
        """Whether an out-of-memory error now was the neighbours' doing: the trial stayed
        within its share while the others held part of it, lately or now."""
        with contextlib.suppress(Exception):
            self._sample()
        if self._limit is None or not self._peaks:
            return False
        if any(peak > self._limit for peak in self._peaks.values()):
            return False
        crowded_at = self._crowded_at
        return crowded_at is not None and time.monotonic() - crowded_at <= CROWDED_WINDOW_S

    def _watch(self) -> None:
        while not self._stopped.wait(SAMPLE_INTERVAL_S):
            try:
                overrun = self._sample()
            except Exception as exc:  # a GPU that stops answering leaves a gap, not a failure
                self._warnings.warn("gpu-guard", f"GPU memory guard: a sample failed: {exc!r}")
                continue
            if overrun is not None:
                try:
                    self._on_exceeded(overrun)
                finally:
                    os.kill(os.getpid(), signal.SIGKILL)

    def _sample(self) -> GpuOverrun | None:
        """One reading of every GPU of the share; the first one past the limit, if any."""
        tree = _this_tree() if self._view in (ProcessView.PIDS, ProcessView.UNKNOWN) else set()
        overrun = None
        for position, device in enumerate(self._share.devices):
            reading = self._read(position, device)
            own = own_memory(self._view, reading, tree, self._context)
            self._note(device, own)
            if crowded(others_memory(reading, own), self._share.total_bytes, self._limit):
                self._crowded_at = time.monotonic()
            limit = self._limit
            if own.bytes is not None and limit is not None and own.bytes > limit:
                overrun = overrun or GpuOverrun(device, own.bytes, limit)
        return overrun

    def _read(self, position: int, device: str) -> Reading:
        """NVML's processes and memory in use, and the framework's figure: each that fails
        is None, and the first failure on a GPU is kept for the trial's note."""
        listed = self._try(device, lambda: self._nvml.processes(device))
        used = self._try(device, lambda: self._nvml.used_bytes(device))
        allocator = self._try(device, lambda: self._allocator(position, device))
        return Reading(listed, used, allocator)

    def _try(self, device: str, read: Callable[[], _T]) -> _T | None:
        try:
            return read()
        except Exception as exc:  # NVMLError and kin: degrade, never fail the trial
            if device not in self._errors and self._view is not ProcessView.NO_PROCESSES:
                self._errors[device] = f"{type(exc).__name__}: {exc}"
                self._warnings.warn(
                    f"nvml-{type(exc).__name__}",
                    f"NVML failed in a trial's GPU memory guard ({type(exc).__name__}: {exc}); "
                    "its figures are the framework's where it has them, else it is unguarded",
                )
            return None

    def _note(self, device: str, own: Own) -> None:
        if own.bytes is None:
            return
        self._peaks[device] = max(own.bytes, self._peaks.get(device, 0))
        if self._sources.get(device) is not Source.NVML_PIDS:
            self._sources[device] = own.source

    def _why_none(self, device: str) -> str:
        if device in self._errors:
            return "NVML failed and no framework figure"
        return f"{self._view.describe()}; no framework figure"


def _this_tree() -> set[int]:
    """This process and every process it started (a DDP trial's ranks among them)."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(child.pid for child in me.children(recursive=True))
    return pids
