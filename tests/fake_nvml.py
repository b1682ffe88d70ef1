"""A FAKE NVML binding, for tests on machines without a GPU: never a GPU's figures.

Workers load it in place of `pynvml` through `TRIALQ_NVML_MODULE=fake_nvml` (with `tests/` on
their `PYTHONPATH`). It reports the fake GPUs a test describes in `$FAKE_NVML_DIR/gpus.json`
(`[{"uuid": "GPU-fake-0", "name": "FakeGPU", "total": BYTES}, ...]`), and as each fake GPU's
compute processes, the files `$FAKE_NVML_DIR/used/<uuid>/<pid>` holding a byte count, written
by fake trials (`hold`) for their own pid; a file whose process has exited counts for nothing,
as the driver frees what a process held when it exits.

It answers as nvidia-ml-py does where trialq asks (errors are `NVMLError` with the code in
`value`, as pynvml's): a card without MIG answers `nvmlDeviceGetMigMode` Not Supported. A card
described with `"mig_mode": 1` and `"mig": [{"uuid": "MIG-...", "name": ..., "total": BYTES,
"slot": N}, ...]` is in MIG mode: `nvmlDeviceGetMaxMigDeviceCount` answers `"mig_slots"` (7),
`nvmlDeviceGetMigDeviceHandleByIndex` answers Not Found at a slot without a MIG device and No
Permission for one marked `"visible": false` (another pod's), and a MIG handle answers its own
UUID, name and memory. With `"privileged": false` the card in MIG mode refuses its own memory
and processes (No Permission), as NVML does in an unprivileged container.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

FAKE_NAME = "FakeGPU (fake NVML, not a GPU)"


NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
_MESSAGES = {
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    6: "Not Found",
}


class NVMLError(Exception):
    """The fake's error, as pynvml's: the NVML return code in `value`."""

    def __init__(self, value: int | str = NVML_ERROR_NOT_FOUND) -> None:
        self.value = value if isinstance(value, int) else NVML_ERROR_NOT_FOUND
        super().__init__(value if isinstance(value, str) else _MESSAGES.get(value, str(value)))


@dataclass(frozen=True)
class _Handle:
    """An opaque device handle, as pynvml's pointer: a card, or a MIG device of one."""

    card: int
    mig: int | None = None


@dataclass(frozen=True)
class _Memory:
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class _Process:
    pid: int
    usedGpuMemory: int


def describe(directory: Path, count: int, total_bytes: int) -> None:
    """Set up `count` fake GPUs of `total_bytes` each under `directory` (a test's step)."""
    gpus = [
        {"uuid": f"GPU-fake-{i}", "name": FAKE_NAME, "total": total_bytes} for i in range(count)
    ]
    (directory / "used").mkdir(parents=True, exist_ok=True)
    (directory / "gpus.json").write_text(json.dumps(gpus))


def hold(n_bytes: int, pid: int | None = None) -> None:
    """A fake trial holds `n_bytes` on each GPU of its `CUDA_VISIBLE_DEVICES`."""
    for uuid in _visible_uuids():
        folder = _dir() / "used" / uuid
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(pid or os.getpid())).write_text(str(n_bytes))


def _visible_uuids() -> list[str]:
    names = [n for n in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if n.strip()]
    gpus = _gpus()
    return [n if n.startswith(("GPU-", "MIG-")) else str(gpus[int(n)]["uuid"]) for n in names]


def _dir() -> Path:
    return Path(os.environ["FAKE_NVML_DIR"])


def _gpus() -> list[dict[str, Any]]:
    return list(json.loads((_dir() / "gpus.json").read_text()))


def _described(handle: _Handle) -> dict[str, Any]:
    """What gpus.json says of a card or of its MIG device."""
    card = _gpus()[handle.card]
    if handle.mig is None:
        return card
    return next(m for m in card["mig"] if m["slot"] == handle.mig)


def _refuses_card(handle: _Handle) -> None:
    """An unprivileged container's NVML refuses a MIG-mode card's own memory and processes."""
    card = _gpus()[handle.card]
    if handle.mig is None and card.get("mig_mode") and card.get("privileged") is False:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)


def nvmlInit() -> None:
    if not (_dir() / "gpus.json").is_file():
        raise NVMLError("fake NVML: no gpus.json")  # as pynvml's Driver Not Loaded


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if not 0 <= index < len(_gpus()):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


def nvmlDeviceGetHandleByUUID(uuid: str) -> _Handle:
    for index, gpu in enumerate(_gpus()):
        if gpu["uuid"] == uuid:
            return _Handle(index)
        for mig in gpu.get("mig", []):
            if mig["uuid"] == uuid and mig.get("visible", True):
                return _Handle(index, int(mig["slot"]))
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    if handle.mig is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # a MIG device has no index of its own
    return handle.card


def nvmlDeviceGetName(handle: _Handle) -> str:
    return str(_described(handle)["name"])


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    return str(_described(handle)["uuid"])


def nvmlDeviceGetMigMode(handle: _Handle) -> list[int]:
    card = _gpus()[handle.card]
    if handle.mig is not None or "mig_mode" not in card:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    mode = int(card["mig_mode"])
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(handle: _Handle) -> int:
    card = _gpus()[handle.card]
    if handle.mig is not None or "mig_mode" not in card:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(card.get("mig_slots", 7))


def nvmlDeviceGetMigDeviceHandleByIndex(handle: _Handle, index: int) -> _Handle:
    card = _gpus()[handle.card]
    if not card.get("mig_mode"):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    for mig in card.get("mig", []):
        if mig["slot"] == index:
            if not mig.get("visible", True):
                raise NVMLError(NVML_ERROR_NO_PERMISSION)
            return _Handle(handle.card, index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: _Handle) -> _Handle:
    if handle.mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(handle.card)


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[_Process]:
    _refuses_card(handle)
    folder = _dir() / "used" / str(_described(handle)["uuid"])
    found = []
    for path in sorted(folder.glob("*")) if folder.is_dir() else []:
        try:
            pid, used = int(path.name), int(path.read_text() or 0)
        except (ValueError, OSError):
            continue
        if _alive(pid):
            found.append(_Process(pid, used))
    return found


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> _Memory:
    _refuses_card(handle)
    total = int(_described(handle)["total"])
    used = sum(p.usedGpuMemory for p in nvmlDeviceGetComputeRunningProcesses(handle))
    return _Memory(total, used, max(0, total - used))


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> object:
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
