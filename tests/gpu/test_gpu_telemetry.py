"""GPU telemetry on a real GPU: NVML readings, a trial's footprint, and a leaked device.

Skipped where NVML (nvidia-ml-py) is missing or sees no GPU, and the trial tests also where
TensorFlow is not a CUDA build: CI's CPU machines skip this module.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from trialq.gpu.device import NvmlGpu, TensorFlowDevice
from trialq.gpu.telemetry import MIB
from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.gpu


@pytest.fixture
def gpu() -> NvmlGpu:
    """NVML's view of the GPU this process's trials would see, or a skip."""
    opened = NvmlGpu.open(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if opened is None:
        pytest.skip("no GPU visible through NVML (nvidia-ml-py missing, no driver or no GPU)")
    return opened


@pytest.fixture
def tensorflow_gpu(gpu: NvmlGpu) -> None:
    """Skip unless TensorFlow here is a CUDA build (checked without touching the GPU)."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    import tensorflow as tf

    if not tf.sysconfig.get_build_info().get("is_cuda_build"):
        pytest.skip("TensorFlow here is not a CUDA build")


def test_nvml_reads_the_visible_gpu(gpu: NvmlGpu) -> None:
    try:
        assert gpu.name.startswith("GPU ") and "GPU-" in gpu.name
        used, busy = gpu.memory_used_bytes(), gpu.utilization_percent()
        assert used is not None and used > 0
        assert busy is not None and 0.0 <= busy <= 100.0
    finally:
        gpu.close()
    device = TensorFlowDevice()
    assert device.memory_used_bytes() is not None and device.name == gpu.name
    device.close()


def _run(spec: Path, redis_url: str) -> dict:
    return submit_study(spec, Settings(broker_url=redis_url), None, None, None, False)


@pytest.mark.integration
@pytest.mark.usefixtures("tensorflow_gpu")
def test_a_gpu_trial_records_memory_in_use_and_utilisation(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(1)
    spec = write_spec(
        """
        [study]
        name = "gpu-footprint"
        n_trials = 1
        [trial]
        entrypoint = "trials:allocates_on_gpu"
        [space.mib]
        type = "categorical"
        choices = [512]
        """
    )
    attrs = _run(spec, redis_url)["trials"][0]["user_attrs"]
    assert attrs["outcome"] == "ok", attrs["error"]
    assert attrs["gpu_peak_bytes"] >= 512 * MIB
    assert attrs["gpu_memory_used_peak_bytes"] >= 512 * MIB
    assert 0.0 < attrs["gpu_utilization_mean"] <= 100.0


@pytest.mark.integration
@pytest.mark.usefixtures("tensorflow_gpu")
def test_a_process_left_holding_gpu_memory_gets_the_next_trial_refused(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "holder.pid"
    start_workers(1)
    spec = write_spec(
        f"""
        [study]
        name = "gpu-leak"
        n_trials = 2
        max_in_flight = 1
        [trial]
        entrypoint = "trials:leaks_gpu_memory_once"
        [space.marker]
        type = "categorical"
        choices = ["{marker}"]
        """
    )
    try:
        trials = _run(spec, redis_url)["trials"]
    finally:
        if marker.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker.read_text()), signal.SIGKILL)
    assert trials[0]["user_attrs"]["outcome"] == "ok"
    refused = trials[1]["user_attrs"]
    assert refused["outcome"] == "error"
    assert "still holds" in refused["error"] and "the trial was not run" in refused["error"]
