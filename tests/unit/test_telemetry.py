"""GPU telemetry and the device-baseline check, driven by `FakeDevice` (no GPU needed)."""

from __future__ import annotations

import threading
import time

import pytest
from trial_requests import trial_request
from waiting import wait_until

from trialq.gpu.device import FakeDevice, TensorFlowDevice
from trialq.gpu.telemetry import MIB, SETTLE_S, DeviceBaseline, Sampler
from trialq.trial.runner import run_trial
from trialq.wire.messages import Outcome, TrialRequest, TrialResult
from trialq.wire.record import recorded_of


def _request(entrypoint: str = "trials:quadratic", **params: object) -> TrialRequest:
    return trial_request(number=4, params=params or {"x": 1.0}, entrypoint=entrypoint, timeout_s=10)


def test_the_sampler_keeps_the_peak_and_the_mean_while_the_trial_runs() -> None:
    device = FakeDevice(used_bytes=100 * MIB, utilization=20.0)
    with Sampler(device, interval_s=0.01) as sampler:
        # Each level held until the sampler has read it, however slow the machine is.
        wait_until(lambda: sampler.result().utilization_mean == 20.0, 10, "a reading at 20 %")
        device.used_bytes, device.utilization = 900 * MIB, 80.0
        wait_until(
            lambda: sampler.result().memory_used_peak_bytes == 900 * MIB, 10, "a reading at 900 MiB"
        )
        device.used_bytes = 300 * MIB
    telemetry = sampler.result()
    assert telemetry.memory_used_peak_bytes == 900 * MIB
    assert telemetry.utilization_mean is not None and 20.0 < telemetry.utilization_mean < 80.0


def test_without_readings_there_is_no_thread_and_nothing_recorded() -> None:
    with Sampler(FakeDevice(), interval_s=0.01) as sampler:
        time.sleep(0.05)
    telemetry = sampler.result()
    assert telemetry.memory_used_peak_bytes is None and telemetry.utilization_mean is None


def test_a_trial_records_its_device_telemetry() -> None:
    device = FakeDevice(peak=5 * MIB, used_bytes=700 * MIB, utilization=55.0)
    result = run_trial(_request(), channel=None, device=device, allowed_modules=("trials",))
    assert result.outcome is Outcome.OK
    assert result.gpu_memory_used_peak_bytes == 700 * MIB
    assert result.gpu_utilization_mean == 55.0
    attrs = recorded_of(result)
    assert attrs["gpu_memory_used_peak_bytes"] == 700 * MIB and attrs["gpu_peak_bytes"] == 5 * MIB


def test_a_device_still_holding_memory_refuses_the_next_trial_and_says_so() -> None:
    baseline = DeviceBaseline.measure(FakeDevice(used_bytes=300 * MIB), 256 * MIB, settle_s=0.3)
    assert baseline is not None
    leaked = FakeDevice(used_bytes=(300 + 4096) * MIB, name="GPU 1 FakeGPU (GPU-abc)")

    result = run_trial(
        _request(), channel=None, device=leaked, allowed_modules=("trials",), baseline=baseline
    )

    assert result.outcome is Outcome.ERROR
    assert not leaked.prepared and result.metrics == {}, "the trial must not have run"
    error = result.error or ""
    assert "device GPU 1 FakeGPU (GPU-abc) still holds 4096 MiB more" in error
    assert "4396 MiB in use, baseline 300 MiB, tolerance 256 MiB" in error
    assert "not run" in error


def test_a_device_back_within_tolerance_runs_the_trial() -> None:
    baseline = DeviceBaseline(used_bytes=300 * MIB, tolerance_bytes=256 * MIB)
    device = FakeDevice(used_bytes=(300 + 200) * MIB)
    result = run_trial(
        _request(), channel=None, device=device, allowed_modules=("trials",), baseline=baseline
    )
    assert result.outcome is Outcome.OK and device.prepared


def test_memory_the_last_trial_is_still_handing_back_is_waited_for() -> None:
    """The previous process's teardown may lag its exit: refuse only what stays held."""
    baseline = DeviceBaseline(300 * MIB, 256 * MIB, settle_s=5.0)
    device = FakeDevice(used_bytes=4096 * MIB)
    threading.Timer(0.3, lambda: setattr(device, "used_bytes", 310 * MIB)).start()
    started = time.monotonic()
    result = run_trial(
        _request(), channel=None, device=device, allowed_modules=("trials",), baseline=baseline
    )
    # Not the 5 s settle: the memory came back after 0.3 s (room for a loaded host).
    assert result.outcome is Outcome.OK and 0.3 <= time.monotonic() - started < 4.5


def test_the_baseline_lets_go_of_the_device_and_is_none_without_readings() -> None:
    device = FakeDevice(used_bytes=MIB)
    assert DeviceBaseline.measure(device, 0) == DeviceBaseline(MIB, 0, SETTLE_S)
    assert device.closed
    assert DeviceBaseline.measure(FakeDevice(), 0) is None


def test_a_result_from_a_worker_without_telemetry_still_validates() -> None:
    old = {"version": 1, "study": "s", "number": 1, "attempt": 1, "outcome": "ok"}
    result = TrialResult.model_validate(old)
    assert result.gpu_memory_used_peak_bytes is None and result.gpu_utilization_mean is None


@pytest.mark.parametrize("visible", ["", "-1", "MIG-1234"])
def test_the_real_device_reads_nothing_where_no_gpu_is_visible(visible: str) -> None:
    device = TensorFlowDevice(visible=visible)
    assert device.memory_used_bytes() is None and device.utilization_percent() is None
    assert device.name == "no GPU"
    device.close()
