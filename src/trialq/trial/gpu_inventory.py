"""A host's GPUs as NVML lists them, and the memory each process holds on each.

NVML is the driver's view: reading it creates no CUDA context, so the worker's parent reads
its GPUs here before it forks trial processes, and each trial process reads its own GPUs'
processes (its memory guard, its start check). The binding is `pynvml` (nvidia-ml-py); tests
on machines without a GPU name a fake module instead (`TRIALQ_NVML_MODULE`), never presented
as a GPU. GPUs are named as CUDA names them in `CUDA_VISIBLE_DEVICES`: an index (NVML's PCI
order; set `CUDA_DEVICE_ORDER=PCI_BUS_ID` where models are mixed), `GPU-<uuid>`, or
`MIG-<uuid>`.

Process ids are the ones NVML reports, which depend on the driver and the container: what
they can be trusted for is found out at the worker's start (`trialq.trial.nvml_probe`) and
judged by `trialq.trial.gpu_attribution`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

from trialq.errors import UsageError


@dataclass(frozen=True)
class Gpu:
    """One GPU of the host: its CUDA name, its model and its memory."""

    id: str
    model: str
    total_bytes: int


class Nvml:
    """An open NVML session: `with Nvml.open(module) as nvml: ...` shuts it down after."""

    def __init__(self, module: ModuleType) -> None:
        self._nvml = module
        self._handles: dict[str, Any] = {}

    @classmethod
    def open(cls, module_name: str = "pynvml") -> Nvml | None:
        """NVML, initialised; None where the binding or the driver is missing."""
        try:
            module = importlib.import_module(module_name)
            module.nvmlInit()
        except Exception:  # ImportError, NVMLError: no GPU to speak of
            return None
        return cls(module)

    def __enter__(self) -> Nvml:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Shut NVML down in this process (it counts opens, so others are unaffected)."""
        self._nvml.nvmlShutdown()
        self._handles.clear()

    def gpus(self, selection: str) -> tuple[Gpu, ...]:
        """The GPUs `selection` names: `all`, indices (`0,1`) or UUIDs, in its order."""
        if selection.strip() == "all":
            ids = [str(index) for index in range(self._nvml.nvmlDeviceGetCount())]
        else:
            ids = [part.strip() for part in selection.split(",") if part.strip()]
        return tuple(self._gpu(gpu_id) for gpu_id in ids)

    def _gpu(self, gpu_id: str) -> Gpu:
        try:
            handle = self.handle(gpu_id)
            model = _text(self._nvml.nvmlDeviceGetName(handle))
            total = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except Exception as exc:
            raise UsageError(f"GPU {gpu_id!r}: NVML does not know it ({exc})") from None
        return Gpu(gpu_id, model, total)

    def handle(self, gpu_id: str) -> Any:
        """NVML's handle for a GPU as CUDA names it."""
        if gpu_id not in self._handles:
            if gpu_id.startswith(("GPU-", "MIG-")):
                self._handles[gpu_id] = self._nvml.nvmlDeviceGetHandleByUUID(gpu_id)
            else:
                self._handles[gpu_id] = self._nvml.nvmlDeviceGetHandleByIndex(int(gpu_id))
        return self._handles[gpu_id]

    def used_bytes(self, gpu_id: str) -> int:
        """Memory in use on the GPU, by every process and the driver's reservations."""
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self.handle(gpu_id)).used)

    def processes(self, gpu_id: str) -> dict[int, int | None]:
        """The memory each process holds on the GPU, by pid as NVML gives it (NVML's compute
        processes; None where NVML has no figure: pynvml's NVML_VALUE_NOT_AVAILABLE)."""
        listed = self._nvml.nvmlDeviceGetComputeRunningProcesses(self.handle(gpu_id))
        return {int(p.pid): _figure(p.usedGpuMemory) for p in listed}

    def allocator_stand_in(self, gpu_id: str) -> int | None:
        """A FAKE binding's stand-in for a framework allocator's figure of this process on
        the GPU (tests/fake_nvml.py); None from a real NVML, which has no such thing."""
        stand_in = getattr(self._nvml, "fakeAllocatorBytes", None)
        return None if stand_in is None else int(stand_in(self.handle(gpu_id)))


def _figure(used: int | None) -> int | None:
    return None if used is None else int(used)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
