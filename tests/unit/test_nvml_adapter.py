"""The NVML adapter against a fake `pynvml` module: which GPU it opens and how it reads.

The real library is exercised by tests/gpu (skipped without a GPU); this pins the mapping
from CUDA_VISIBLE_DEVICES to NVML's devices and the handling of NVML's errors on any machine.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from trialq.gpu.device import NvmlGpu, TensorFlowDevice

GIB = 2**30


class FakeNVMLError(Exception):
    """Stands for pynvml.NVMLError."""


@dataclass
class _Memory:
    used: int


@dataclass
class _Rates:
    gpu: int


class FakeNvml(types.ModuleType):
    """Two GPUs, by index 0 and 1 and by UUID; counts inits and shutdowns."""

    NVMLError = FakeNVMLError

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.opened = 0
        self.lost = False
        self.uuids = ["GPU-aaaa", "GPU-bbbb"]

    def nvmlInit(self) -> None:
        self.opened += 1

    def nvmlShutdown(self) -> None:
        self.opened -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index >= len(self.uuids):
            raise FakeNVMLError("invalid index")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid not in self.uuids:
            raise FakeNVMLError("not found")
        return self.uuids.index(uuid)

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "FakeGPU 80GB"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.uuids[handle]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        if self.lost:
            raise FakeNVMLError("GPU is lost")
        return _Memory(used=(handle + 1) * GIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Rates:
        return _Rates(gpu=37)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    yield fake


@pytest.mark.parametrize(
    ("visible", "name"),
    [
        (None, "GPU 0 FakeGPU 80GB (GPU-aaaa)"),
        ("1", "GPU 1 FakeGPU 80GB (GPU-bbbb)"),
        ("1,0", "GPU 1 FakeGPU 80GB (GPU-bbbb)"),
        ("GPU-bbbb", "GPU 1 FakeGPU 80GB (GPU-bbbb)"),
    ],
)
def test_the_first_visible_gpu_is_opened_by_index_or_uuid(
    nvml: FakeNvml, visible: str | None, name: str
) -> None:
    gpu = NvmlGpu.open(visible)
    assert gpu is not None and gpu.name == name
    gpu.close()
    assert nvml.opened == 0


@pytest.mark.parametrize("visible", ["", "-1", "7", "GPU-zzzz", "MIG-GPU-aaaa/1/0"])
def test_no_gpu_is_opened_where_none_is_visible_and_nvml_is_let_go(
    nvml: FakeNvml, visible: str
) -> None:
    assert NvmlGpu.open(visible) is None
    assert nvml.opened == 0


def test_readings_and_a_lost_gpu_reading_as_nothing(nvml: FakeNvml) -> None:
    device = TensorFlowDevice(visible="1")
    assert device.memory_used_bytes() == 2 * GIB and device.utilization_percent() == 37.0
    nvml.lost = True
    assert device.memory_used_bytes() is None
    device.close()
    assert nvml.opened == 0


def test_the_real_pynvml_has_what_the_fake_stands_for() -> None:
    """Where nvidia-ml-py is installed (.ci/run's oldest run), its pynvml offers every call the
    adapter makes on the fake above, so the fake's answers stand for a real library's."""
    pynvml = pytest.importorskip("pynvml")
    calls = [name for name in vars(FakeNvml) if name.startswith("nvml")]
    assert len(calls) >= 8
    missing = [name for name in calls if not callable(getattr(pynvml, name, None))]
    assert not missing, missing
    assert issubclass(pynvml.NVMLError, Exception)
