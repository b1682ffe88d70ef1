"""Trials for a worker on FAKE GPUs (`tests/fake_nvml.py`): each says what it holds by writing
the fake's files, never touching a GPU. Their figures are a fake's, never a GPU's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fake_interposer
import fake_nvml

from trialq.trial.context import TrialContext

MIB = 2**20


def records_its_gpu(params: dict[str, Any], trial: TrialContext) -> float:
    """Holds `hold_mb` on its GPUs for `sleep_s`, and records what its slot gave it."""
    fake_nvml.hold(int(params.get("hold_mb", 100)) * MIB)
    record = {
        "pid": os.getpid(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "budget": os.environ.get("TRIALQ_GPU_BUDGET_BYTES"),
        "mps_limit": os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
        "interposer_limit": os.environ.get("CUDA_DEVICE_MEMORY_LIMIT_0"),
        "interposer_cache": os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
        "preload": os.environ.get("LD_PRELOAD"),
        "started": time.time(),
    }
    time.sleep(float(params.get("sleep_s", 1.0)))
    record["ended"] = time.time()
    Path(str(params["log"]), f"{os.getpid()}.json").write_text(json.dumps(record))
    return 1.0


def overruns_its_budget(params: dict[str, Any], trial: TrialContext) -> float:
    """Holds half its budget through its fake framework and twice its budget beside it, as a
    trial with CuPy beside PyTorch would; returns after `sleep_s` unless killed."""
    budget = int(os.environ["TRIALQ_GPU_BUDGET_BYTES"])
    fake_interposer.allocate(allocator_bytes=budget // 2)
    for _chunk in range(8):  # beside it, a quarter of its budget at a time
        fake_interposer.allocate(outside_bytes=budget // 4)
    time.sleep(float(params.get("sleep_s", 30.0)))
    return 1.0


_STRANGER = """
import os, sys, time
sys.path.insert(0, {tests!r})
os.environ["CUDA_VISIBLE_DEVICES"] = {visible!r}
import fake_nvml
parent = os.getpid()
if os.fork():
    os._exit(0)
while os.getppid() == parent:  # no stranger yet: still in the trial's tree till it exits
    time.sleep(0.001)
fake_nvml.hold({n_bytes})
time.sleep({live_s})
"""


def crowded_out_once(params: dict[str, Any], trial: TrialContext) -> float:
    """Attempt 1: a process that is no trial's fills the GPU, and the trial's next allocation
    fails with CUDA's message while it holds a tenth of its budget. Later attempts return."""
    if trial.attempt > 1:
        return 1.0
    budget = int(os.environ["TRIALQ_GPU_BUDGET_BYTES"])
    total = int(os.environ["TRIALQ_GPU_TOTAL_BYTES"])
    fake_nvml.hold(budget // 10)
    _start_stranger(total - budget // 10, live_s=2.0)
    time.sleep(0.5)  # the guard samples every 0.05 s
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (fake GPU)")


def _start_stranger(n_bytes: int, live_s: float) -> None:
    """A process outside the worker's tree (forked twice, in a session of its own)."""
    code = _STRANGER.format(
        tests=str(Path(__file__).parent), visible=os.environ["CUDA_VISIBLE_DEVICES"],
        n_bytes=n_bytes, live_s=live_s,
    )  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, start_new_session=True)


def runs_out_of_memory(params: dict[str, Any], trial: TrialContext) -> float:
    """Holds `hold_mb` for `sleep_s`, then fails with CUDA's out-of-memory message: its own
    OOM, or a neighbour's, by what the others held meanwhile."""
    fake_nvml.hold(int(params.get("hold_mb", 100)) * MIB)
    time.sleep(float(params.get("sleep_s", 0.5)))
    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (fake GPU)")
