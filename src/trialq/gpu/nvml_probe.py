"""The start probe: what NVML's process list can be trusted for on this host, found once.

At its start, a worker that owns GPUs starts one short-lived process that opens a CUDA
context on its first GPU and allocates `PROBE_BYTES` there (through the driver's own library,
no framework: a few hundred milliseconds), then looks at NVML's processes on that GPU from the
worker's parent, which never opens a context itself: does NVML name the probe by its pid, and
with its memory? The answer (`ProcessView`, `trialq.gpu.attribution.classify`) goes
into the ready line, the worker's heartbeat and every trial's checks. A fake NVML
(tests/fake_nvml.py) stands in for the device as well: the probe holds its memory there.

Run as `python -m trialq.gpu.nvml_probe MODULE BYTES` it is the probe process itself.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass

from trialq.gpu.attribution import ProcessView, classify
from trialq.gpu.inventory import Nvml

PROBE_BYTES = 64 * 2**20
"""What the probe allocates past its context: NVML must count at least this for it."""

READY_TIMEOUT_S = 60.0
"""How long the probe may take to open its context (a cold driver can take tens of seconds)."""

LISTED_WAIT_S = 0.5
"""How long NVML is given to list the probe once it holds its memory."""


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found, and why where it could not find out."""

    view: ProcessView
    detail: str | None = None


def probe(nvml: Nvml, gpu_id: str, nvml_module: str) -> ProbeResult:
    """Find out, from the worker's parent, what NVML names on `gpu_id` (the parent opens no
    context: the probe process does, and exits)."""
    try:
        nvml.processes(gpu_id)
    except Exception as exc:  # NVMLError: no process list here at all
        return ProbeResult(ProcessView.NO_PROCESSES, f"{type(exc).__name__}: {exc}")
    try:
        child = _start(gpu_id, nvml_module)
    except OSError as exc:  # no process to start: not found out, the worker starts anyway
        return ProbeResult(ProcessView.UNKNOWN, f"the probe did not start: {exc}")
    try:
        ready = _ready(child)
        if ready is not None:
            return ProbeResult(ProcessView.UNKNOWN, ready)
        return ProbeResult(_watch(nvml, gpu_id, child.pid))
    finally:
        _stop(child)


def _start(gpu_id: str, nvml_module: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu_id}
    command = [sys.executable, "-m", __name__, nvml_module, str(PROBE_BYTES)]
    return subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _ready(child: subprocess.Popen[bytes]) -> str | None:
    """None once the probe holds its memory; else why it could not."""
    assert child.stdout is not None
    line = _read_line(child, READY_TIMEOUT_S)
    if line == b"ready\n":
        return None
    _stop(child)
    error = (child.stderr.read() if child.stderr else b"").decode(errors="replace").strip()
    return f"the probe could not open a CUDA context: {error.splitlines()[-1] if error else line!r}"


def _read_line(child: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    assert child.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return b"(no answer within %d s)" % timeout_s
    return child.stdout.readline()


def _watch(nvml: Nvml, gpu_id: str, pid: int) -> ProcessView:
    """NVML's verdict on the probe, given a moment to list it."""
    deadline = time.monotonic() + LISTED_WAIT_S
    while True:
        try:
            listed: dict[int, int | None] | None = nvml.processes(gpu_id)
        except Exception:
            listed = None
        view = classify(listed, pid, PROBE_BYTES)
        if view is ProcessView.PIDS or time.monotonic() >= deadline:
            return view
        time.sleep(0.05)


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.stdin is not None and not child.stdin.closed:
        child.stdin.close()  # the probe exits when its stdin closes
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _hold(nvml_module: str, n_bytes: int) -> None:
    """In the probe process: a context and `n_bytes` on the visible GPU (a fake NVML's stand-in
    where the binding is one)."""
    module = importlib.import_module(nvml_module)
    fake = getattr(module, "fakeCreateContext", None)
    if fake is not None:
        fake(n_bytes)
        return
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    _cuda(cuda.cuInit(0), "cuInit")
    _cuda(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    _cuda(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    _cuda(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    _cuda(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(n_bytes)), "cuMemAlloc_v2")


def _cuda(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} returned CUDA error {status}")


def main(argv: list[str]) -> int:
    """The probe process: hold, say so, and wait for the worker to close stdin."""
    _hold(argv[0], int(argv[1]))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
