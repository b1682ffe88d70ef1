"""The GPU seam: how a trial process prepares its device and measures what it used.

Everything here runs inside the trial's own process (never the worker's parent: CUDA does
not survive fork). TensorFlow is consulted only if the trial itself imported it.
"""

from __future__ import annotations

import os
import sys
from typing import Protocol


class Device(Protocol):
    """What the runner needs of a device, real or fake."""

    def prepare(self) -> None:
        """Called before the entrypoint is imported; must not initialise the device."""

    def peak_bytes(self) -> int | None:
        """Peak device memory the trial used, or None where there is no GPU."""


class TensorFlowDevice:
    """The real device: memory growth before first use, the allocator's peak after."""

    def prepare(self) -> None:
        """Let TensorFlow grow its GPU memory instead of taking the whole card at once."""
        os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    def peak_bytes(self) -> int | None:
        """The TensorFlow allocator's peak on GPU:0, if the trial used TensorFlow on a GPU."""
        tf = sys.modules.get("tensorflow")
        if tf is None:
            return None
        try:
            if not tf.config.list_physical_devices("GPU"):
                return None
            return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
        except (RuntimeError, ValueError, AttributeError):
            return None


class FakeDevice:
    """A stand-in GPU for tests on machines without one (named as a fake on purpose)."""

    def __init__(self, peak: int | None = None) -> None:
        self.prepared = False
        self._peak = peak

    def prepare(self) -> None:
        """Remember that preparation happened, touch nothing."""
        self.prepared = True

    def peak_bytes(self) -> int | None:
        """The peak the test configured."""
        return self._peak
