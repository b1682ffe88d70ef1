"""A FAKE NVML binding, for tests on machines without a GPU: never a GPU's figures.

Workers load it in place of `pynvml` through `TRIALQ_NVML_MODULE=fake_nvml` (with `tests/` on
their `PYTHONPATH`). It reports the fake GPUs a test describes in `$FAKE_NVML_DIR/gpus.json`
(`[{"uuid": "GPU-fake-0", "name": "FakeGPU", "total": BYTES}, ...]`), and as each fake GPU's
compute processes, the files `$FAKE_NVML_DIR/used/<uuid>/<pid namespace>-<pid>` holding a byte
count (and, after it, what of it a fake framework allocator holds: the rest is held outside it,
as CuPy beside PyTorch, or a CUDA context), written by fake trials (`hold`) for their own pid; a file whose process has exited counts
for nothing, as the driver frees what a process held when it exits.

It answers as nvidia-ml-py does where trialq asks (errors are `NVMLError` with the code in
`value`, as pynvml's): a card without MIG answers `nvmlDeviceGetMigMode` Not Supported. A card
described with `"mig_mode": 1` and `"mig": [{"uuid": "MIG-...", "name": ..., "total": BYTES,
"slot": N}, ...]` is in MIG mode: `nvmlDeviceGetMaxMigDeviceCount` answers `"mig_slots"` (7),
`nvmlDeviceGetMigDeviceHandleByIndex` answers Not Found at a slot without a MIG device and No
Permission for one marked `"visible": false` (another pod's), and a MIG handle answers its own
UUID, name and memory. With `"privileged": false` the card in MIG mode refuses its own memory
and processes (No Permission), as NVML does in an unprivileged container.

How it names processes is the driver family a test picks (`behave_as`, kept in
`$FAKE_NVML_DIR/driver.json`), as real drivers answer a caller in a container that does not
share the host's PID namespace (docs/oom.md, "What NVML can be trusted for"):
- pids `shared` (the default): every process by its own pid, as with the host's PID namespace
  (every caller in one namespace: no containers);
- pids `host`: every process by a "host" pid that no namespace has (a driver that does not
  translate pids: NVIDIA/nvidia-docker#1483, #179);
- pids `callers`: the caller's namespace's processes by their pids there, the others by host
  pids (translated where it can be);
- pids `translated`: the caller's namespace's processes by their pids, the others left out;
- memory `reported`, `zero` or `unavailable` (`usedGpuMemory` None: pynvml's reading of
  NVML_VALUE_NOT_AVAILABLE), as some drivers and virtualisation layers report it;
- processes `error`: every process query raises `NVMLError`;
- `mps`: an MPS server serves the GPU: the compute processes are the server alone (a host pid,
  holding no memory of its own), and its clients, each by the family's pid rule, are listed by
  `nvmlDeviceGetMPSComputeRunningProcesses`, as NVML lists them apart.
The device's memory in use (`nvmlDeviceGetMemoryInfo`) is every process's, whatever the family.
Two callers in two PID namespaces (`unshare --pid --fork --mount-proc`) share one fake GPU as two
pods do: a holder keeps a lock on its file, which tells a caller in another namespace it lives.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

FAKE_NAME = "FakeGPU (fake NVML, not a GPU)"

PID_MAX_LIMIT = 2**22
"""Linux's largest pid (`PID_MAX_LIMIT` on 64 bits): the fake's "host" pids lie above it."""

_held: dict[Path, int] = {}
"""The files this process holds memory through, each with its open, locked descriptor."""


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
    usedGpuMemory: int | None


@dataclass(frozen=True)
class _Holder:
    """A process holding memory on a fake GPU: its pid namespace, its pid there, its bytes."""

    namespace: int
    pid: int
    used: int
    allocator: int
    """What of `used` a fake framework allocator holds (`fakeAllocatorBytes`)."""


def describe(directory: Path, count: int, total_bytes: int) -> None:
    """Set up `count` fake GPUs of `total_bytes` each under `directory` (a test's step)."""
    gpus = [
        {"uuid": f"GPU-fake-{i}", "name": FAKE_NAME, "total": total_bytes} for i in range(count)
    ]
    (directory / "used").mkdir(parents=True, exist_ok=True)
    (directory / "gpus.json").write_text(json.dumps(gpus))


def behave_as(
    directory: Path,
    pids: str = "shared",
    memory: str = "reported",
    processes: str = "ok",
    mps: bool = False,
) -> None:
    """Answer as a driver family does (the module's docstring): a test's step."""
    assert pids in ("shared", "host", "callers", "translated") and processes in ("ok", "error")
    assert memory in ("reported", "zero", "unavailable")
    family = {"pids": pids, "memory": memory, "processes": processes, "mps": mps}
    (directory / "driver.json").write_text(json.dumps(family))


def hold(n_bytes: int, pid: int | None = None, outside: int = 0) -> None:
    """A fake trial holds `n_bytes` through its fake framework's allocator on each GPU of its
    `CUDA_VISIBLE_DEVICES`, and `outside` bytes more outside it (a second library, a context);
    `pid`: on behalf of another process of this namespace, alive for as long as that is."""
    figures = f"{n_bytes + outside} {n_bytes}"
    for uuid in _visible_uuids():
        folder = _dir() / "used" / uuid
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{_namespace()}-{pid or os.getpid()}"
        if pid is None or pid == os.getpid():
            _hold_locked(path, figures)
        else:
            path.write_text(figures)


def _hold_locked(path: Path, figures: str) -> None:
    """Write this process's figures through a descriptor it keeps locked until it exits."""
    fd = _held.get(path)
    if fd is None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[path] = fd
    os.ftruncate(fd, 0)
    os.pwrite(fd, figures.encode(), 0)


def fakeCreateContext(n_bytes: int) -> None:
    """The fake's stand-in for a CUDA context: this process holds `n_bytes` on its visible GPU
    (trialq's start probe calls it where the binding is a fake, never on a GPU)."""
    hold(0, outside=n_bytes)


def fakeAllocatorBytes(handle: _Handle) -> int:
    """The fake's stand-in for a framework allocator's current reserved bytes: what this
    process holds through it on the GPU, read in the process itself, whatever NVML's family
    says of it (what it holds `outside` the allocator is not in it, as in a real one's)."""
    me = (_namespace(), os.getpid())
    return sum(h.allocator for h in _holders(handle) if (h.namespace, h.pid) == me)


def _namespace() -> int:
    """This process's PID namespace (the inode of /proc/self/ns/pid)."""
    return os.stat("/proc/self/ns/pid").st_ino


def _family() -> dict[str, Any]:
    path = _dir() / "driver.json"
    return dict(json.loads(path.read_text())) if path.is_file() else {}


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


MPS_SERVER_PID = PID_MAX_LIMIT
"""The fake MPS server's pid: the host's, never this namespace's."""


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[_Process]:
    _refuses_card(handle)
    family = _family()
    if family.get("processes") == "error":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # every process query fails, as some drivers'
    if family.get("mps"):
        return [_Process(MPS_SERVER_PID, 0)]  # the clients are listed apart
    return _clients(handle, family)


def nvmlDeviceGetMPSComputeRunningProcesses(handle: _Handle) -> list[_Process]:
    _refuses_card(handle)
    family = _family()
    if family.get("processes") == "error":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _clients(handle, family) if family.get("mps") else []


def _clients(handle: _Handle, family: dict[str, Any]) -> list[_Process]:
    pids, here = family.get("pids", "shared"), _namespace()
    found = []
    for holder in _holders(handle):
        foreign = holder.namespace != here
        if pids == "translated" and foreign:
            continue  # a translating driver leaves other namespaces' processes out
        untranslated = pids == "host" or (pids == "callers" and foreign)
        pid = _host_pid(holder) if untranslated else holder.pid
        found.append(_Process(pid, _memory(holder.used, family.get("memory", "reported"))))
    return found


def _host_pid(holder: _Holder) -> int:
    """A pid no namespace has, distinct for each (namespace, pid): what an untranslating
    driver reports to a caller in a container."""
    return PID_MAX_LIMIT + 1 + (holder.namespace % 1000) * PID_MAX_LIMIT + holder.pid


def _memory(used: int, memory: str) -> int | None:
    return {"reported": used, "zero": 0}.get(memory)


def _holders(handle: _Handle) -> list[_Holder]:
    """Every live process holding memory on the GPU, whichever namespace it is in."""
    folder = _dir() / "used" / str(_described(handle)["uuid"])
    found = []
    for path in sorted(folder.glob("*")) if folder.is_dir() else []:
        try:
            namespace, pid = (int(part) for part in path.name.split("-"))
            figures = [int(part) for part in path.read_text().split()] or [0]
        except (ValueError, OSError):
            continue
        used, allocator = figures[0], figures[-1]
        if _alive(namespace, pid, path):
            found.append(_Holder(namespace, pid, used, allocator))
    return found


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> _Memory:
    _refuses_card(handle)
    total = int(_described(handle)["total"])
    used = sum(holder.used for holder in _holders(handle))
    return _Memory(total, used, max(0, total - used))


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> object:
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def _alive(namespace: int, pid: int, path: Path) -> bool:
    """A process of this namespace by its pid; one of another by the lock it keeps."""
    if namespace != _namespace():
        return _locked(path)
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _locked(path: Path) -> bool:
    if path in _held:
        return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)  # closing drops a lock taken here
    return False
