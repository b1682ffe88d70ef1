"""The allocation interposer: HAMi-core's `libvgpu.so`, the libcuda hook behind HAMi's
`CUDA_DEVICE_MEMORY_LIMIT`, holding each trial to its budget where no MPS daemon serves.

The library must be in the process before CUDA's driver library is: it is preloaded into the
worker itself (`LD_PRELOAD`, set by docker/worker-cmd.sh from `TRIALQ_GPU_INTERPOSER`), so
every trial process the worker forks has it; a library loaded later interposes nothing. It
reads its limits when CUDA starts, in the trial process, after the trial's slot put them in
its environment (`GpuShare.environment`): `CUDA_DEVICE_MEMORY_LIMIT_<i>`, the trial's budget
on its i-th visible device, and `CUDA_DEVICE_MEMORY_SHARED_CACHE`, a file of the trial's
own, since the processes that share one file share one limit (HAMi-core's
`multiprocess_memory_limit.c`: one container's). An allocation past the limit is refused
with CUDA_ERROR_OUT_OF_MEMORY, which the framework raises as its own OOM.

Read from HAMi-core's sources (commit 8f3a89c6, docker/worker-torch.Dockerfile builds it);
not run here: no GPU, and the real library needs one. docs/oom.md says what each deployment
gets.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

LIMIT = "CUDA_DEVICE_MEMORY_LIMIT"
SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
SETTING = "TRIALQ_GPU_INTERPOSER"


def trial_environment(budget_bytes: int, devices: int, pid: int) -> dict[str, str]:
    """The variables that hold trial process `pid` to `budget_bytes` on each of its
    `devices` visible devices (counted from 0, as CUDA numbers what the trial sees)."""
    env = {f"{LIMIT}_{ordinal}": str(budget_bytes) for ordinal in range(devices)}
    env[SHARED_CACHE] = str(Path(tempfile.gettempdir()) / f"trialq-vgpu-{pid}.cache")
    return env


def preloaded(library: str, maps: str) -> bool:
    """Whether `library` is mapped in the process whose `/proc/<pid>/maps` is `maps`."""
    name = Path(library).name
    return any(line.rstrip().endswith(("/" + name, library)) for line in maps.splitlines())
