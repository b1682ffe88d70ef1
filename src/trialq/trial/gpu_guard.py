"""The GPU memory guard of a trial process that shares its GPUs (`trialq worker --gpus`): a
backstop behind the framework's cap and whatever enforces the budget where memory is taken
(MPS's pinned limit, the allocation interposer: docs/oom.md).

Like the host-memory guard (`trialq.trial.memory_guard`), a thread samples what the trial
holds on each of its GPUs. It kills only for growth it can name: where NVML names the trial's
processes with their memory (`ProcessView.PIDS`), what they hold past the budget plus the
allowance for memory outside the framework's allocator (`trialq.gpu.allowance`), with more
than that allowance outside the allocator's current reserved bytes. Then it leaves the result
`gpu_guard` with those figures (never `oom`: docs/oom.md, "A guard kill") and SIGKILLs its own
process, and its neighbours on the GPU run on. Where NVML does not name the trial's processes
(`other-pids`, no memory figures), the only figure is the framework's own, which its cap
already bounds: the guard never kills on it, and records it.

It also tells a trial's own out-of-memory error from one a neighbour caused, from current
figures (peaks are for the records): while sampling it notes when the others on a GPU (the
device's memory in use less the trial's own now) held more than the card less this trial's
share. A trial that ran out of memory within its share, with the others inside its share
lately or now, was crowded out (`neighbour_caused`): the driver sends it again and the
sampler never hears of it. Without a figure of its own, an OOM stays the trial's own.
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

from trialq.gpu.allowance import allowance_bytes
from trialq.gpu.attribution import (
    Overrun,
    Own,
    ProcessView,
    Reading,
    Source,
    crowded,
    others_memory,
    overrun,
    own_memory,
)
from trialq.gpu.inventory import Nvml
from trialq.gpu.once_per_worker import OncePerWorker
from trialq.gpu.share import GpuShare
from trialq.trial.frameworks.session import allocator_reserved, chosen_framework

SAMPLE_INTERVAL_S = 0.05
CROWDED_WINDOW_S = 10.0
"""How recently the others must have been inside this trial's share for its OOM to be theirs."""

MIB = 2**20

AllocatorFigure = Callable[[int, str], "int | None"]
"""What the trial's framework allocator holds now on its GPU at a position of its share
(CUDA's order); None: no framework figure."""

_log = logging.getLogger("trialq.gpu")
_T = TypeVar("_T")


@dataclass(frozen=True)
class GpuOverrun:
    """A guard kill: which GPU, and the figures it was killed for."""

    device: str
    figures: Overrun

    def text(self) -> str:
        """The trial's error, as its result carries it."""
        found = self.figures
        reserved = "no framework" if found.reserved is None else f"{_mib(found.reserved)} reserved"
        return (
            f"killed by trialq's GPU memory guard: NVML counted {_mib(found.own)} for the "
            f"trial's processes on GPU {self.device}, {_mib(found.outside)} of it outside its "
            f"framework's allocator ({reserved}), past its budget of {_mib(found.budget)} plus "
            f"{_mib(found.allowance)} allowed outside the allocator (docs/oom.md)"
        )


def framework_figure(nvml: Nvml) -> AllocatorFigure:
    """What the trial's framework allocator holds now on a GPU; a fake NVML's stand-in where
    no framework runs (tests/fake_nvml.py: a real NVML has none)."""

    def read(position: int, device: str) -> int | None:
        held = allocator_reserved()
        if held is None:
            return None
        if position < len(held):
            return held[position]
        return nvml.allocator_stand_in(device)

    return read


class GpuGuard:
    """Samples the trial's memory on its GPUs; on growth it can name (`overrun`), calls
    `on_exceeded` and SIGKILLs this process."""

    def __init__(
        self,
        nvml: Nvml,
        share: GpuShare,
        context_bytes: int,
        on_exceeded: Callable[[GpuOverrun], None],
        view: ProcessView = ProcessView.UNKNOWN,
        allocator: AllocatorFigure | None = None,
        warnings: OncePerWorker | None = None,
        framework: Callable[[], str | None] = chosen_framework,
    ) -> None:
        self._nvml = nvml
        self._share = share
        self._context = context_bytes
        self._limit = None if share.budget_bytes is None else share.budget_bytes + context_bytes
        self._on_exceeded = on_exceeded
        self._view = view
        self._allocator = allocator if allocator is not None else framework_figure(nvml)
        self._warnings = warnings or OncePerWorker(_log)
        self._framework = framework
        self._peaks: dict[str, int] = {}
        self._now: dict[str, int] = {}
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
        """Whether an out-of-memory error now was the neighbours' doing: the trial holds no
        more than its share now while the others held part of it, lately or now."""
        with contextlib.suppress(Exception):
            self._sample()
        if self._limit is None or not self._now:
            return False
        if any(own > self._limit for own in self._now.values()):
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
        """One reading of every GPU of the share; the first growth it can name, if any."""
        tree = _this_tree() if self._view in (ProcessView.PIDS, ProcessView.UNKNOWN) else set()
        framework = self._framework()
        allowance = allowance_bytes(framework, self._context)
        found = None
        for position, device in enumerate(self._share.devices):
            reading = self._read(position, device)
            own = own_memory(self._view, reading, tree, self._context)
            self._note(device, own)
            if crowded(others_memory(reading, own), self._share.total_bytes, self._limit):
                self._crowded_at = time.monotonic()
            past = overrun(own, reading, self._share.budget_bytes, allowance, framework)
            if past is not None and found is None:
                found = GpuOverrun(device, past)
        return found

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
        self._now[device] = own.bytes
        self._peaks[device] = max(own.bytes, self._peaks.get(device, 0))
        if self._sources.get(device) is not Source.NVML_PIDS:
            self._sources[device] = own.source

    def _why_none(self, device: str) -> str:
        if device in self._errors:
            return "NVML failed and no framework figure"
        return f"{self._view.describe()}; no framework figure"


def _mib(n_bytes: int) -> str:
    return f"{n_bytes // MIB} MiB"


def _this_tree() -> set[int]:
    """This process and every process it started (a DDP trial's ranks among them)."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(child.pid for child in me.children(recursive=True))
    return pids
