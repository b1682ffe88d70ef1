"""The GPU seam: how a trial process prepares its device and measures what it used.

Everything that reads a device goes through `Device`: the runner, the telemetry sampler
and the worker's baseline check read nothing else, so CPU tests drive them all with
`FakeDevice`. The real one, `GpuDevice`, asks NVML (nvidia-ml-py) for the memory in use and
how busy the GPU is. What a framework sets, caps and reads (its allocator's peaks) is its
adapter's, behind the framework seam (`trialq.trial.frameworks`): the runner asks both.
NVML is the driver's view, not CUDA's: reading it creates no CUDA context, so the worker's
parent may read it once before it forks trial processes, provided it lets go (`close`).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Protocol


class Device(Protocol):
    """What the runner and the telemetry need of a device, real or fake.

    Readings are None where they cannot be had (no GPU, no NVML, no TensorFlow): callers
    record None and go on, never fail a trial for want of a measurement.
    """

    @property
    def name(self) -> str:
        """Which device, for messages: index, model and UUID where known."""

    def prepare(self) -> None:
        """Called before the entrypoint is imported; must not initialise the device."""

    def peak_bytes(self) -> int | None:
        """Peak memory the trial's allocator used, where the device itself knows it (a fake
        does); the real device leaves it to the framework's adapter (None)."""

    def memory_used_bytes(self) -> int | None:
        """Memory in use on the device now, by every process on it (NVML's `used`)."""

    def utilization_percent(self) -> float | None:
        """How busy the device was over the driver's last sample period, 0 to 100."""

    def close(self) -> None:
        """Let go of monitoring handles (the worker's parent must, before it forks)."""


class NvmlGpu:
    """One GPU as the NVIDIA driver sees it, opened with `open` and let go with `close`."""

    def __init__(self, nvml: ModuleType, handle: Any, name: str) -> None:
        self._nvml = nvml
        self._handle = handle
        self.name = name

    @classmethod
    def open(cls, visible: str | None) -> NvmlGpu | None:
        """The first GPU of `visible` (CUDA_VISIBLE_DEVICES; unset: GPU 0), or None."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return None
        handle = _visible_handle(pynvml, visible)
        if handle is None:
            pynvml.nvmlShutdown()
            return None
        return cls(pynvml, handle, _describe(pynvml, handle))

    def memory_used_bytes(self) -> int | None:
        """Memory in use on the device by every process (and the driver's reservations)."""
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except self._nvml.NVMLError:
            return None  # a GPU fallen off the bus reads as no reading, not as a crash

    def utilization_percent(self) -> float | None:
        """The share of the driver's last sample period in which a kernel ran."""
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        """Shut NVML down in this process (it counts opens, so others are unaffected)."""
        self._nvml.nvmlShutdown()


def _visible_handle(nvml: ModuleType, visible: str | None) -> Any | None:
    """NVML's handle for CUDA's first visible device: by UUID, else by index.

    An index is taken as NVML's (PCI bus order); CUDA orders by speed unless
    CUDA_DEVICE_ORDER=PCI_BUS_ID, so name GPUs by UUID where models are mixed (a worker with
    `--gpus` does). A container given one GPU sees it as index 0 in both. A MIG device is
    named by its `MIG-` UUID.
    """
    if visible is not None and not visible.strip():
        return None  # CUDA_VISIBLE_DEVICES="" hides every GPU
    first = (visible or "0").split(",")[0].strip()
    try:
        if first.startswith(("GPU-", "MIG-")):
            return nvml.nvmlDeviceGetHandleByUUID(first)
        index = int(first)
        return nvml.nvmlDeviceGetHandleByIndex(index) if index >= 0 else None
    except (ValueError, nvml.NVMLError):
        return None


def _describe(nvml: ModuleType, handle: Any) -> str:
    """`GPU 0 NVIDIA H100 80GB HBM3 (GPU-1234...)`, as much of it as NVML will say."""
    try:
        index = nvml.nvmlDeviceGetIndex(handle)
        return f"GPU {index} {nvml.nvmlDeviceGetName(handle)} ({nvml.nvmlDeviceGetUUID(handle)})"
    except nvml.NVMLError:
        return "GPU (unnamed)"


class GpuDevice:
    """The real device: NVML's readings of the trial's first visible GPU."""

    def __init__(self, visible: str | None = None) -> None:
        self._visible = visible if visible is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
        self._gpu: NvmlGpu | None = None
        self._opened = False

    @property
    def name(self) -> str:
        """NVML's name for the device, or `no GPU` where NVML sees none."""
        gpu = self._nvml()
        return gpu.name if gpu is not None else "no GPU"

    def prepare(self) -> None:
        """Nothing of its own: each framework's settings are its adapter's
        (`trialq.trial.frameworks`), set by the runner before the entrypoint's import."""

    def peak_bytes(self) -> int | None:
        """None: the allocator's peaks are the framework adapter's (`gpu_peaks_bytes`)."""
        return None

    def memory_used_bytes(self) -> int | None:
        """NVML's memory in use on the visible device, or None without NVML or a GPU."""
        gpu = self._nvml()
        return gpu.memory_used_bytes() if gpu is not None else None

    def utilization_percent(self) -> float | None:
        """NVML's utilisation of the visible device, or None without NVML or a GPU."""
        gpu = self._nvml()
        return gpu.utilization_percent() if gpu is not None else None

    def close(self) -> None:
        """Shut NVML down; a later reading opens it again."""
        if self._gpu is not None:
            self._gpu.close()
        self._gpu, self._opened = None, False

    def _nvml(self) -> NvmlGpu | None:
        """Open NVML on first use only: a trial without readings never loads it."""
        if not self._opened:
            self._gpu, self._opened = NvmlGpu.open(self._visible), True
        return self._gpu


TensorFlowDevice = GpuDevice
"""The name `GpuDevice` had while it was TensorFlow's (kept for callers not yet renamed)."""


class FakeDevice:
    """A stand-in GPU for tests on machines without one (named as a fake on purpose).

    Tests set `used_bytes` and `utilization` at any time, as a trial would move the real ones.
    """

    def __init__(
        self,
        peak: int | None = None,
        used_bytes: int | None = None,
        utilization: float | None = None,
        name: str = "GPU 0 FakeGPU (GPU-fake)",
    ) -> None:
        self.name = name
        self.prepared = False
        self.closed = False
        self.used_bytes = used_bytes
        self.utilization = utilization
        self._peak = peak

    def prepare(self) -> None:
        """Remember that preparation happened, touch nothing."""
        self.prepared = True

    def peak_bytes(self) -> int | None:
        """The peak the test configured."""
        return self._peak

    def memory_used_bytes(self) -> int | None:
        """What the test says is in use now."""
        return self.used_bytes

    def utilization_percent(self) -> float | None:
        """What the test says the utilisation is now."""
        return self.utilization

    def close(self) -> None:
        """Remember that the handles were let go."""
        self.closed = True
