"""PyTorch: expandable segments before CUDA starts, a memory fraction per visible GPU set
at CUDA's own start, and the caching allocator's reserved peak per GPU after the trial.

The cap is `torch.cuda.set_per_process_memory_fraction(budget / total, i)` on each device
PyTorch sees: past it the caching allocator raises `torch.OutOfMemoryError` in this process
only. Setting it starts CUDA, and a process that started CUDA cannot hand CUDA to a forked
child (Lightning's `ddp_fork`, fork-based `torch.multiprocessing`, DataLoader workers that
touch CUDA: "Cannot re-initialize CUDA in forked subprocess"). So the cap is not set when the
trial starts: it is queued with `torch.cuda._lazy_call` (private: pinned by
tests/unit/test_private_hooks_torch.py), the queue PyTorch runs inside its own lazy
initialisation, before the first CUDA call of the trial returns. Until the trial's code
touches CUDA, `torch.cuda.is_initialized()` stays False and nothing here has asked CUDA
anything (not even `torch.cuda.is_available()`, which starts the driver and so poisons fork).
A child the trial forks inherits the queue and caps itself at its own start; a process the
trial starts afresh (a DDP rank) calls `cap_this_process()`. The CUDA context itself (some
300 to 500 MiB) is outside the cap.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from trialq.gpu.share import GpuShare
from trialq.trial.frameworks import Cap

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
"""The allocator's settings: read by every PyTorch 2 (2.13 reads `PYTORCH_ALLOC_CONF` too)."""

ALLOC_CONF_NEW = "PYTORCH_ALLOC_CONF"
LAZY_CALL = "_lazy_call"
"""`torch.cuda._lazy_call(callable)`: run now if CUDA started, else queued for its start."""

EXPANDABLE = "expandable_segments:True"
"""Segments that grow in place instead of new blocks: less memory reserved and not used,
which is what a budget counts (PyTorch's "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF")."""

PAGE_HEADROOM_BYTES = (20 + 2) * 1024 * 1024
"""Expandable segments map physical memory in pages of 20 MiB (large pool) and 2 MiB (small
pool), while the fraction is checked against the bytes asked for: the reserved peak can pass
the fraction by up to a page of each (on an H200, 16 pieces of 128 MiB against a 2,048 MiB
fraction reserved 2,060 MiB). The fraction is set that much below the budget, so the reserved
peak stays within it (docs/frameworks.md)."""

NOT_STARTED = (
    "CUDA never started in the trial's process: its cap waited for it "
    "(children it forked inherit it; a process it started afresh calls cap_this_process)"
)


class PyTorch:
    """The adapter for trials that use PyTorch (Lightning included)."""

    name = "torch"

    def environment(self, share: GpuShare | None, env: Mapping[str, str]) -> dict[str, str | None]:
        """Expandable segments, unless the user set the allocator's settings themselves."""
        if env.get(ALLOC_CONF) or env.get(ALLOC_CONF_NEW):
            return {}
        return {ALLOC_CONF: EXPANDABLE}

    def started(self) -> str | None:
        """PyTorch's own word: `torch.cuda.is_initialized()` (public; starts nothing)."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return "PyTorch initialised CUDA"
        return None

    def cap(self, share: GpuShare, environment_in_time: bool) -> Cap:
        """A memory fraction on every GPU PyTorch sees, set when CUDA starts (at once where
        it has started already); asks CUDA nothing before that."""
        if share.budget_bytes is None:
            return Cap(False, "no GPU budget: the trial may use its whole GPUs")
        import torch

        if not cuda_built():
            return Cap(False, "PyTorch is built without CUDA")
        late = None if environment_in_time else f"CUDA started before {ALLOC_CONF} was set"
        cap = LazyCap(share.budget_bytes, late)
        lazy_call = getattr(torch.cuda, LAZY_CALL, None)
        if lazy_call is None:
            cap()  # the old way: the cap starts CUDA itself, before the trial's code
            gone = f"torch.cuda.{LAZY_CALL} is gone: the cap started CUDA before the trial"
            return Cap(cap.outcome().applied, gone, settle=cap.outcome)
        lazy_call(cap)
        return Cap(True, late, settle=cap.outcome)

    def peaks(self) -> tuple[int, ...] | None:
        """`torch.cuda.max_memory_reserved(i)` per visible GPU, once CUDA started."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        count = torch.cuda.device_count()
        return tuple(int(torch.cuda.max_memory_reserved(i)) for i in range(count)) or None

    def reserved(self) -> tuple[int, ...] | None:
        """`torch.cuda.memory_reserved(i)` per visible GPU (the caching allocator's segments,
        cuBLAS/cuDNN workspaces among them); () before CUDA started."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return ()
        count = torch.cuda.device_count()
        return tuple(int(torch.cuda.memory_reserved(i)) for i in range(count))

    def free_memory(self, after_oom: bool) -> None:
        """The caching allocator's unused blocks, back to the device, once CUDA started."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def guard_gap(self) -> str | None:
        """None: `torch.cuda.is_initialized()` is public."""
        return None


class LazyCap:
    """The cap as the call PyTorch makes at CUDA's start, on every device it then sees.

    It never raises: an error here would be raised by the trial's first CUDA call (PyTorch's
    `DeferredCudaCallError`); it is kept and said on the trial's result instead."""

    def __init__(self, budget_bytes: int, late: str | None) -> None:
        self._budget_bytes = budget_bytes
        self._late = late
        self._outcome: Cap | None = None

    def __call__(self) -> None:
        import torch

        try:
            count = torch.cuda.device_count()
            for index in range(count):
                _set_fraction(torch, self._budget_bytes, index)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            self._outcome = Cap(False, f"PyTorch's cap failed at CUDA's start: {why}")
            return
        seen = count > 0
        self._outcome = Cap(True, self._late) if seen else Cap(False, "PyTorch sees no GPU")

    def outcome(self) -> Cap:
        """What the cap came to: set (or failed) at CUDA's start, or still waiting for it."""
        return self._outcome if self._outcome is not None else Cap(True, NOT_STARTED)


def cuda_built() -> bool:
    """Whether this PyTorch was built with CUDA (public, and asks no driver anything)."""
    backends: Any = importlib.import_module("torch.backends.cuda")
    return bool(backends.is_built())


def cap_this_process(environ: Mapping[str, str] | None = None) -> Cap:
    """The trial's cap for a process the trial started afresh (a DDP rank, a `spawn`ed
    worker), from the share it inherits in its environment; applied at this process's own
    CUDA start. A child the trial forked needs none: it inherited the trial's queued cap."""
    share = GpuShare.from_environment(os.environ if environ is None else environ)
    if share is None:
        return Cap(False, "no GPU share in this process's environment: nothing to cap")
    return ADAPTER.cap(share, environment_in_time=ADAPTER.started() is None)


def fraction(budget_bytes: int, total_bytes: int) -> float:
    """The memory fraction that holds a trial's reserved peak within `budget_bytes`: a page
    of each pool below it (`PAGE_HEADROOM_BYTES`), never below half of it."""
    capped = max(budget_bytes - PAGE_HEADROOM_BYTES, budget_bytes // 2)
    return min(1.0, capped / total_bytes)


def _set_fraction(torch: Any, budget_bytes: int, index: int) -> None:
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(fraction(budget_bytes, total), index)


ADAPTER = PyTorch()
