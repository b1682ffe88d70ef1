"""A host's GPUs as NVML lists them, and the memory each process holds on each.

NVML is the driver's view: reading it creates no CUDA context, so the worker's parent reads
its GPUs here before it forks trial processes, and each trial process reads its own GPUs'
processes (its memory guard, its start check). The binding is `pynvml` (nvidia-ml-py); tests
on machines without a GPU name a fake module instead (`TRIALQ_NVML_MODULE`), never presented
as a GPU.

Every GPU is named by its UUID, as `CUDA_VISIBLE_DEVICES` accepts it: `GPU-<uuid>` for a
whole card, `MIG-<uuid>` for a MIG device. An index would be NVML's (PCI bus order) while
CUDA's default order is fastest first, so on a host with mixed cards a trial given `1` could
run on another card than the one its worker guards; a UUID names the same device to both.
A card in MIG mode is no CUDA device itself: its MIG devices are, each with its own memory
(NVML's MIG handle: `nvmlDeviceGetMigMode`, `nvmlDeviceGetMaxMigDeviceCount`,
`nvmlDeviceGetMigDeviceHandleByIndex`), so `all`, an index or a card's UUID name every MIG
device of a card in MIG mode that this process can see (a pod given one MIG device sees
that one; NVML answers the others Not Found or No Permission).

Process ids are the ones NVML reports, which depend on the driver and the container: what
they can be trusted for is found out at the worker's start (`trialq.gpu.nvml_probe`) and
judged by `trialq.gpu.attribution`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

from trialq.errors import UsageError

MIG_ENABLED = 1
"""NVML's `NVML_DEVICE_MIG_ENABLE`: the current mode of a card cut into MIG devices."""


@dataclass(frozen=True)
class Gpu:
    """One CUDA device of the host (a card, or a MIG device): its UUID, model and memory."""

    id: str
    """`GPU-<uuid>` or `MIG-<uuid>`, as NVML and `CUDA_VISIBLE_DEVICES` name it."""
    model: str
    total_bytes: int
    index: int | None = None
    """NVML's index of the card (a MIG device's parent): CUDA's ordinal for it where
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`, as MPS's per-device limits count (`trialq.gpu.mps`)."""


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

    @staticmethod
    def absence(module_name: str = "pynvml") -> str:
        """Why `open` found no NVML, in words a user can act on: the binding missing reads
        otherwise than a binding without a driver or GPU under it."""
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            return f"no NVML binding ({exc}; it is the package nvidia-ml-py)"
        try:
            module.nvmlInit()
        except Exception as exc:  # pynvml's NVMLError_LibraryNotFound, _DriverNotLoaded...
            reason = str(exc).strip() or type(exc).__name__
            return f"no NVIDIA driver or GPU found (NVML: {reason})"
        module.nvmlShutdown()
        return "NVML failed once and opened on a second try"

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
        """The devices `selection` names, in its order: `all`, NVML indices (`0,1`) or UUIDs;
        a card in MIG mode as its MIG devices."""
        if selection.strip() == "all":
            parts = [str(index) for index in range(self._nvml.nvmlDeviceGetCount())]
        else:
            parts = [part.strip() for part in selection.split(",") if part.strip()]
        return tuple(gpu for part in parts for gpu in self._devices(part))

    def _devices(self, part: str) -> list[Gpu]:
        try:
            handle = self._open(part)
            if part.startswith("MIG-"):
                return [self._describe(handle, self._card_index(handle))]
            index = int(self._nvml.nvmlDeviceGetIndex(handle))
            migs = self._mig_handles(handle)
            return [self._describe(h, index) for h in ([handle] if migs is None else migs)]
        except self._nvml.NVMLError as exc:
            raise UsageError(f"GPU {part!r}: NVML does not know it ({exc})") from None

    def _open(self, part: str) -> Any:
        if part.startswith(("GPU-", "MIG-")):
            return self._nvml.nvmlDeviceGetHandleByUUID(part)
        if not part.isdigit():
            raise UsageError(f"GPU {part!r}: neither an index nor a GPU-/MIG- UUID")
        return self._nvml.nvmlDeviceGetHandleByIndex(int(part))

    def _mig_handles(self, card: Any) -> list[Any] | None:
        """The MIG devices of a card in MIG mode that NVML shows this process; None for a
        card that is not in MIG mode (or cannot be: NVML answers Not Supported)."""
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(card)
        except self._nvml.NVMLError:
            return None
        if current != MIG_ENABLED:
            return None
        found = []
        for slot in range(int(self._nvml.nvmlDeviceGetMaxMigDeviceCount(card))):
            try:
                found.append(self._nvml.nvmlDeviceGetMigDeviceHandleByIndex(card, slot))
            except self._nvml.NVMLError:
                continue  # no MIG device at this slot, or not this container's
        return found

    def _card_index(self, mig: Any) -> int | None:
        """The index of a MIG device's card, where NVML says it."""
        try:
            card = self._nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
            return int(self._nvml.nvmlDeviceGetIndex(card))
        except self._nvml.NVMLError:
            return None

    def _describe(self, handle: Any, index: int | None) -> Gpu:
        uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
        self._handles[uuid] = handle
        model = _text(self._nvml.nvmlDeviceGetName(handle))
        total = int(self._nvml.nvmlDeviceGetMemoryInfo(handle).total)
        return Gpu(uuid, model, total, index)

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
        """The memory each process holds on the GPU, by pid as NVML gives it (None where NVML
        has no figure: pynvml's NVML_VALUE_NOT_AVAILABLE): its compute processes, and the
        clients of an MPS server on it, which NVML lists apart (the compute list names the
        server, `nvidia-cuda-mps-server`, not them)."""
        handle = self.handle(gpu_id)
        listed = list(self._nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        listed += self._mps_clients(handle)
        return {int(p.pid): _figure(p.usedGpuMemory) for p in listed}

    def _mps_clients(self, handle: Any) -> list[Any]:
        """NVML's MPS clients on a device; none where the binding or the driver has no such
        query (Not Supported, Function Not Found: no MPS to list)."""
        query = getattr(self._nvml, "nvmlDeviceGetMPSComputeRunningProcesses", None)
        if query is None:
            return []
        try:
            return list(query(handle))
        except self._nvml.NVMLError:
            return []

    def allocator_stand_in(self, gpu_id: str) -> int | None:
        """A FAKE binding's stand-in for a framework allocator's figure of this process on
        the GPU (tests/fake_nvml.py); None from a real NVML, which has no such thing."""
        stand_in = getattr(self._nvml, "fakeAllocatorBytes", None)
        return None if stand_in is None else int(stand_in(self.handle(gpu_id)))


def _figure(used: int | None) -> int | None:
    return None if used is None else int(used)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
