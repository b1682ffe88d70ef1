"""Measuring, on this host, what one CUDA context holds and what CUDA lets a process allocate.

A trial's budget is what its framework may allocate; its process also holds a CUDA context
that no framework cap counts, and NVML's total is more than CUDA will ever hand out. Where
both are assumed (`gpu_plan.CONTEXT_RESERVE_MB`), a context larger than assumed makes the
GPU memory guard (budget plus one context) kill a trial that kept within its framework's cap,
before the framework's own OOM, which `fit_batch_size` and the trial could have caught.

So a worker measures, once when it starts, in a short-lived process of its own
(`python -m trialq.gpu.context_probe GPU`, which sees only that GPU): never in its parent,
whose forks a CUDA context would not survive (docs/design.md). The probe reads NVML's memory
in use on its GPU, makes CUDA's primary context through the driver API (libcuda, by ctypes:
no framework needed), asks CUDA what it can still allocate (`cuMemGetInfo`), reads NVML
again, prints one JSON line and exits. The context is what NVML saw grow: at a worker's start
none of its trials runs, and a neighbour allocating meanwhile could only make the figure
larger, the side on which the guard fires later, never earlier. A framework's own kernels
and libraries (cuBLAS, cuDNN) load later, inside the trial, and are not in the figure.

Never run on a GPU in the session that wrote it: tests/unit/test_context_probe.py checks
the arithmetic and the parent's side against fake answers.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from trialq.gpu.inventory import Nvml

MIB = 2**20
NVML_MODULE = "TRIALQ_NVML_MODULE"
"""The NVML binding the probe loads: the worker's (a fake one in tests without a GPU)."""

PROBE_TIMEOUT_S = 60.0
"""How long the probe may take (a first CUDA start on a large card takes seconds)."""

Runner = Callable[[Sequence[str], dict[str, str]], str]
"""Runs the probe's command with its environment; what it printed on stdout."""


@dataclass(frozen=True)
class ContextMeasure:
    """One GPU, measured by a process that held a CUDA context on it."""

    device: str
    context_bytes: int
    """What NVML saw the context take."""
    usable_bytes: int
    """What this worker's trial processes may hold on the GPU altogether, their contexts
    included: CUDA's free memory with the probe's context made, plus that context."""
    total_bytes: int
    """CUDA's total (NVML's may be larger)."""


def measured(device: str, before: int, after: int, free: int, total: int) -> ContextMeasure:
    """The measure from the probe's four readings: NVML's used bytes `before` and `after`
    the context, CUDA's `free` and `total` bytes with it made."""
    context = max(0, after - before)
    return ContextMeasure(device, context, min(total, free + context), total)


def measure(
    device: str, run: Runner | None = None, nvml_module: str = "pynvml"
) -> ContextMeasure | str:
    """The measure of `device` by a short-lived probe process, or why there is none."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": device, NVML_MODULE: nvml_module}
    command = [sys.executable, "-m", __name__, device]
    try:
        printed = (run or _run)(command, env)
        return ContextMeasure(**json.loads(printed.strip().splitlines()[-1]))
    except Exception as exc:
        return f"the CUDA context on {_named(device)} was not measured: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Measures:
    """A worker's GPUs as measured when it started: the measures by GPU, the reasons where
    none was taken."""

    found: Mapping[str, ContextMeasure]
    missing: tuple[str, ...] = ()

    def line(self) -> str:
        """What the worker's ready line says of them."""
        parts = [
            f"{_named(m.device)}: CUDA context {m.context_bytes // MIB} MiB measured, "
            f"{m.usable_bytes // MIB} MiB usable"
            for m in self.found.values()
        ]
        if self.missing:
            parts.append(f"{'; '.join(self.missing)} (a context is assumed)")
        return "; ".join(parts)


def measure_all(
    devices: Iterable[str], run: Runner | None = None, nvml_module: str = "pynvml"
) -> Measures:
    """Every GPU of `devices` measured, each by its own probe, all at once (a worker with
    eight GPUs waits for one probe's time, not eight)."""
    ids = tuple(dict.fromkeys(devices))
    with ThreadPoolExecutor(max_workers=max(1, len(ids))) as pool:
        answers = list(pool.map(lambda device: measure(device, run, nvml_module), ids))
    found = {a.device: a for a in answers if isinstance(a, ContextMeasure)}
    return Measures(found, tuple(a for a in answers if isinstance(a, str)))


def _run(command: Sequence[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True
    )
    return done.stdout


def probe(device: str, nvml_module: str = "pynvml") -> ContextMeasure:
    """In the probe's own process: the four readings around CUDA's primary context."""
    nvml = Nvml.open(nvml_module)
    if nvml is None:
        raise RuntimeError(Nvml.absence(nvml_module))
    with nvml:
        before = nvml.used_bytes(device)
        free, total = _context_and_memory()
        after = nvml.used_bytes(device)
    return measured(device, before, after, free, total)


def _context_and_memory() -> tuple[int, int]:
    """CUDA's primary context on the one visible GPU, made; its free and total memory."""
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check(cuda.cuInit(0), "cuInit")
    _check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    _check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    _check(cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return free.value, total.value


def _check(status: int, call: str) -> None:
    if status != 0:
        raise RuntimeError(f"{call} failed with CUDA error {status}")


if __name__ == "__main__":
    module = os.environ.get(NVML_MODULE, "pynvml")
    print(json.dumps(asdict(probe(sys.argv[1], module))))


def _named(device: str) -> str:
    """A device as the ready line names it: a UUID stands alone (`GPU-…`, `MIG-…`)."""
    return device if device.startswith(("GPU-", "MIG-")) else f"GPU {device}"
