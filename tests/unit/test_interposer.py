"""The environment each trial gets for the allocation interposer (HAMi-core's libvgpu.so).

A FAKE cannot run the real library here (it hooks libcuda, which needs a GPU): what is
checked is what each trial process is handed, as HAMi-core's sources read it, and that a
worker naming a library it does not have preloaded is refused in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trialq.errors import UsageError
from trialq.gpu import interposer
from trialq.gpu.attribution import ProcessView
from trialq.gpu.inventory import Gpu
from trialq.gpu.plan import GpuPlan, held_by
from trialq.gpu.share import GpuShare
from trialq.settings import Settings
from trialq.worker.state import WorkerState

MIB = 2**20
GIB = 2**30
CARDS = (
    Gpu("GPU-a", "FakeGPU (a fake)", 16 * GIB, 0),
    Gpu("GPU-b", "FakeGPU (a fake)", 16 * GIB, 1),
)


def test_each_trial_is_limited_to_its_budget_on_each_of_its_devices_with_a_cache_of_its_own() -> (
    None
):
    share = GpuPlan(trials_per_gpu=2, gpus_per_trial=2, interposer=True).shares(CARDS)[0]
    env = share.environment()

    assert share.budget_bytes is not None
    assert (
        env["CUDA_DEVICE_MEMORY_LIMIT_0"]
        == env["CUDA_DEVICE_MEMORY_LIMIT_1"]
        == str(share.budget_bytes)
    )
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].endswith(f"trialq-vgpu-{os.getpid()}.cache")
    assert "LD_PRELOAD" not in env  # preloaded into the worker: too late in a forked trial
    assert GpuShare.from_environment(env) == share


def test_where_mps_serves_the_pinned_limit_holds_the_budget_not_the_interposer() -> None:
    share = GpuPlan(trials_per_gpu=2, interposer=True, mps_served=True).shares(CARDS)[0]
    env = share.environment()

    assert not share.interposed and "CUDA_DEVICE_MEMORY_LIMIT_0" not in env
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in env


def test_without_the_interposer_a_trial_gets_no_limit_of_its() -> None:
    env = GpuPlan(trials_per_gpu=2).shares(CARDS)[0].environment()
    assert not any(name.startswith("CUDA_DEVICE_MEMORY") for name in env)


def test_a_library_is_preloaded_only_where_the_process_maps_it() -> None:
    maps = "7f..-7f.. r-xp 00000000 08:01 42  /usr/local/lib/trialq/libvgpu.so\n"
    assert interposer.preloaded("/usr/local/lib/trialq/libvgpu.so", maps)
    assert not interposer.preloaded(
        "/usr/local/lib/trialq/libvgpu.so", "7f..  /usr/lib/libc.so.6\n"
    )


def test_a_worker_naming_an_interposer_it_has_not_preloaded_is_refused_in_one_line() -> None:
    settings = Settings(gpu_interposer="/nowhere/libvgpu.so")
    with pytest.raises(UsageError, match="not preloaded in the worker; start it with LD_PRELOAD"):
        WorkerState(settings)._interposer_preloaded()
    # A library this process does map (a STAND-IN, not the interposer) reads as preloaded.
    mapped = next(
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.split()[-1].endswith(".so") or ".so." in line.split()[-1]
    )
    assert WorkerState(Settings(gpu_interposer=mapped))._interposer_preloaded()


def test_the_ready_line_says_what_holds_the_budgets() -> None:
    plain = GpuPlan(trials_per_gpu=2).shares(CARDS)
    interposed = GpuPlan(trials_per_gpu=2, interposer=True).shares(CARDS)
    served = GpuPlan(trials_per_gpu=2, interposer=True, mps_served=True).shares(CARDS)

    assert "frameworks' caps only" in held_by(plain, ProcessView.PIDS)
    assert "the guard's backstop" in held_by(plain, ProcessView.PIDS)
    assert "allocation interposer" in held_by(interposed, ProcessView.OTHER_PIDS)
    assert "no guard kill" in held_by(interposed, ProcessView.OTHER_PIDS)
    assert "MPS's pinned limit" in held_by(served, None)
