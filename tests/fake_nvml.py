"""A FAKE NVML binding, for tests on machines without a GPU: never a GPU's figures.

Workers load it in place of `pynvml` through `TRIALQ_NVML_MODULE=fake_nvml` (with `tests/` on
their `PYTHONPATH`). It reports the fake GPUs a test describes in `$FAKE_NVML_DIR/gpus.json`
(`[{"uuid": "GPU-fake-0", "name": "FakeGPU", "total": BYTES}, ...]`), and as each fake GPU's
compute processes, the files `$FAKE_NVML_DIR/used/<uuid>/<pid>` holding a byte count, written
by fake trials (`hold`) for their own pid; a file whose process has exited counts for nothing,
as the driver frees what a process held when it exits.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

FAKE_NAME = "FakeGPU (fake NVML, not a GPU)"


class NVMLError(Exception):
    """The fake's error, as pynvml's."""


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
    return [n if n.startswith("GPU-") else gpus[int(n)]["uuid"] for n in names]


def _dir() -> Path:
    return Path(os.environ["FAKE_NVML_DIR"])


def _gpus() -> list[dict[str, object]]:
    return list(json.loads((_dir() / "gpus.json").read_text()))


def nvmlInit() -> None:
    if not (_dir() / "gpus.json").is_file():
        raise NVMLError("fake NVML: no gpus.json")


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_gpus()):
        raise NVMLError(f"fake NVML: no GPU {index}")
    return index


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    for index, gpu in enumerate(_gpus()):
        if gpu["uuid"] == uuid:
            return index
    raise NVMLError(f"fake NVML: no GPU {uuid}")


def nvmlDeviceGetIndex(handle: int) -> int:
    return handle


def nvmlDeviceGetName(handle: int) -> str:
    return str(_gpus()[handle]["name"])


def nvmlDeviceGetUUID(handle: int) -> str:
    return str(_gpus()[handle]["uuid"])


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[_Process]:
    folder = _dir() / "used" / str(_gpus()[handle]["uuid"])
    found = []
    for path in sorted(folder.glob("*")) if folder.is_dir() else []:
        try:
            pid, used = int(path.name), int(path.read_text() or 0)
        except (ValueError, OSError):
            continue
        if _alive(pid):
            found.append(_Process(pid, used))
    return found


def nvmlDeviceGetMemoryInfo(handle: int) -> _Memory:
    total = int(str(_gpus()[handle]["total"]))
    used = sum(p.usedGpuMemory for p in nvmlDeviceGetComputeRunningProcesses(handle))
    return _Memory(total, used, max(0, total - used))


def nvmlDeviceGetUtilizationRates(handle: int) -> object:
    raise NVMLError("fake NVML: no utilisation")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
