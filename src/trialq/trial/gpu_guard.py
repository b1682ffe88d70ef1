"""The GPU memory cap of a trial process that shares its GPUs (`trialq worker --gpus`).

Like the host-memory guard (`trialq.trial.memory_guard`), a thread samples what the trial
holds: NVML's memory in use by this process and its descendants, on each of its GPUs. Past
its share (its budget plus one CUDA context) it leaves word and kills its own process at
once, so the trial ends `oom` and its neighbours on the GPU run on: a framework's cap can be
bypassed (a second framework, a CUDA library's own pool), NVML's count cannot.

It also tells a trial's own out-of-memory error from one a neighbour caused: while sampling
it notes when the others on a GPU held more than the card less this trial's share. A trial
that ran out of memory within its own share, with the others inside its share lately or now,
was crowded out (`neighbour_caused`): the driver sends it again and the sampler never hears
of it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from trialq.trial.gpu_inventory import Nvml
from trialq.trial.gpu_share import GpuShare

SAMPLE_INTERVAL_S = 0.05
CROWDED_WINDOW_S = 10.0
"""How recently the others must have been inside this trial's share for its OOM to be theirs."""

MIB = 2**20


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


class GpuGuard:
    """Samples this process tree's memory on its GPUs; past `share`'s budget plus
    `context_bytes`, calls `on_exceeded` and SIGKILLs this process."""

    def __init__(
        self,
        nvml: Nvml,
        share: GpuShare,
        context_bytes: int,
        on_exceeded: Callable[[GpuOverrun], None],
    ) -> None:
        self._nvml = nvml
        self._share = share
        self._limit = None if share.budget_bytes is None else share.budget_bytes + context_bytes
        self._on_exceeded = on_exceeded
        self._peaks: dict[str, int] = {}
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
        """The most this process tree held on each of its GPUs while sampled."""
        return dict(self._peaks)

    def neighbour_caused(self) -> bool:
        """Whether an out-of-memory error now was the neighbours' doing: the trial stayed
        within its share while the others held part of it, lately or now."""
        with contextlib.suppress(Exception):
            self._sample()
        if self._limit is None or any(peak > self._limit for peak in self._peaks.values()):
            return False
        crowded = self._crowded_at
        return crowded is not None and time.monotonic() - crowded <= CROWDED_WINDOW_S

    def _watch(self) -> None:
        while not self._stopped.wait(SAMPLE_INTERVAL_S):
            try:
                overrun = self._sample()
            except Exception:  # a GPU that stops answering leaves a gap, not a failed trial
                continue
            if overrun is not None:
                try:
                    self._on_exceeded(overrun)
                finally:
                    os.kill(os.getpid(), signal.SIGKILL)

    def _sample(self) -> GpuOverrun | None:
        """One reading of every GPU of the share; the first one past the limit, if any."""
        own_pids = _this_tree()
        overrun = None
        for device in self._share.devices:
            processes = self._nvml.processes(device)
            own = sum(used for pid, used in processes.items() if pid in own_pids)
            others = sum(processes.values()) - own
            self._peaks[device] = max(own, self._peaks.get(device, 0))
            if self._limit is None:
                continue
            if (
                self._share.total_bytes is not None
                and others > self._share.total_bytes - self._limit
            ):
                self._crowded_at = time.monotonic()
            if own > self._limit and overrun is None:
                overrun = GpuOverrun(device, own, self._limit)
        return overrun


def _this_tree() -> set[int]:
    """This process and every process it started (a DDP trial's ranks among them)."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(child.pid for child in me.children(recursive=True))
    return pids
