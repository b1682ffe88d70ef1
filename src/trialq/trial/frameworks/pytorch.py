"""PyTorch: expandable segments before CUDA starts, a memory fraction per visible GPU after
the import, and the caching allocator's reserved peak per GPU after the trial.

The cap is `torch.cuda.set_per_process_memory_fraction(budget / total, i)` on each visible
device: past it the caching allocator raises `torch.OutOfMemoryError` in this process only.
It counts what the allocator already holds, so it holds even when CUDA started at the
entrypoint's import; only the allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`) come too late
then, and the trial says so. The CUDA context itself (some 300 to 500 MiB) is outside it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from trialq.trial.frameworks import Cap
from trialq.trial.gpu_share import GpuShare

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
"""The allocator's settings: read by every PyTorch 2 (2.13 reads `PYTORCH_ALLOC_CONF` too)."""

ALLOC_CONF_NEW = "PYTORCH_ALLOC_CONF"
EXPANDABLE = "expandable_segments:True"
"""Segments that grow in place instead of new blocks: less memory reserved and not used,
which is what a budget counts (PyTorch's "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF")."""


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
        """A memory fraction on every GPU PyTorch sees (this starts CUDA in the trial)."""
        if share.budget_bytes is None:
            return Cap(False, "no GPU budget: the trial may use its whole GPUs")
        import torch

        if not torch.cuda.is_available():
            return Cap(False, "PyTorch sees no CUDA device")
        for index in range(torch.cuda.device_count()):
            _set_fraction(torch, share.budget_bytes, index)
        late = None if environment_in_time else f"CUDA started before {ALLOC_CONF} was set"
        return Cap(True, late)

    def peaks(self) -> tuple[int, ...] | None:
        """`torch.cuda.max_memory_reserved(i)` per visible GPU, once CUDA started."""
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        count = torch.cuda.device_count()
        return tuple(int(torch.cuda.max_memory_reserved(i)) for i in range(count)) or None

    def free_memory(self, after_oom: bool) -> None:
        """The caching allocator's unused blocks, back to the device, once CUDA started."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def guard_gap(self) -> str | None:
        """None: `torch.cuda.is_initialized()` is public."""
        return None


def _set_fraction(torch: Any, budget_bytes: int, index: int) -> None:
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), index)


ADAPTER = PyTorch()
