"""Measuring a CUDA context, against fake answers only (no GPU here; named as fakes).

What is checked: the arithmetic from the probe's readings, the parent's side (the probe is
a process of its own that sees only its GPU; its one JSON line read back; a probe that fails
is a reason, never the worker's failure), and the probe's readings around the context with
the fake NVML (tests/fake_nvml.py) and a fake CUDA driver call that "makes" a 300 MiB
context. Whether the figures are right on a GPU is for a GPU run: never done in the session
that wrote this.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import fake_nvml
import pytest

from trialq.errors import UsageError
from trialq.gpu import context_probe
from trialq.gpu.context_probe import ContextMeasure, measure, measured
from trialq.gpu.inventory import Gpu
from trialq.gpu.plan import CONTEXT_RESERVE_MB, FRAMEWORK_LIBRARIES_MB, GpuPlan
from trialq.gpu.share import GpuShare

MIB, GIB = 2**20, 2**30


def test_the_context_is_what_nvml_saw_grow_and_usable_is_free_plus_it() -> None:
    got = measured("0", before=GIB, after=GIB + 512 * MIB, free=10 * GIB, total=12 * GIB)
    assert got == ContextMeasure("0", 512 * MIB, 10 * GIB + 512 * MIB, 12 * GIB)


def test_memory_freed_meanwhile_never_makes_a_negative_context() -> None:
    got = measured("0", before=2 * GIB, after=GIB, free=11 * GIB, total=12 * GIB)
    assert got.context_bytes == 0 and got.usable_bytes == 11 * GIB


def test_the_parent_runs_the_probe_as_a_process_that_sees_only_its_gpu() -> None:
    asked: list[tuple[list[str], str]] = []
    answer = ContextMeasure("GPU-fake-1", 300 * MIB, 11 * GIB, 12 * GIB)

    def fake_probe_run(command: Sequence[str], env: dict[str, str]) -> str:
        asked.append((list(command), env["CUDA_VISIBLE_DEVICES"]))
        return "some CUDA chatter\n" + json.dumps(answer.__dict__) + "\n"

    assert measure("GPU-fake-1", run=fake_probe_run) == answer
    ((command, visible),) = asked
    assert command[-3:] == ["-m", "trialq.gpu.context_probe", "GPU-fake-1"]
    assert visible == "GPU-fake-1"


def test_a_probe_that_fails_is_a_reason_not_an_error() -> None:
    def fake_probe_run(command: Sequence[str], env: dict[str, str]) -> str:
        raise OSError("no such driver (a fake's failure)")

    reason = measure("0", run=fake_probe_run)
    assert isinstance(reason, str) and "GPU 0 was not measured" in reason
    assert "a fake's failure" in reason


def test_the_probe_reads_nvml_around_the_context_it_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvml.describe(tmp_path, count=1, total_bytes=12 * GIB)
    monkeypatch.setenv("FAKE_NVML_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-fake-0")

    def fake_cuda_context() -> tuple[int, int]:
        fake_nvml.hold(300 * MIB)  # the context NVML then sees this process hold
        return 11 * GIB, 12 * GIB - 64 * MIB

    monkeypatch.setattr(context_probe, "_context_and_memory", fake_cuda_context)
    got = context_probe.probe("GPU-fake-0", nvml_module="fake_nvml")
    assert got == ContextMeasure("GPU-fake-0", 300 * MIB, 11 * GIB + 300 * MIB, 12 * GIB - 64 * MIB)


CARD = Gpu("0", "FakeGPU (a fake)", 16 * GIB)
FAKE_MEASURE = {"0": ContextMeasure("0", 700 * MIB, 15 * GIB, 16 * GIB - 100 * MIB)}
"""A fake measure: CUDA lets the worker's processes have 15 GiB, a context takes 700 MiB."""


LIBRARIES = FRAMEWORK_LIBRARIES_MB * MIB
"""What a framework's libraries add to the probe's bare context (`gpu_plan`)."""


def test_a_measured_context_and_usable_memory_replace_the_assumed_ones() -> None:
    first, second = GpuPlan(trials_per_gpu=2).shares((CARD,), FAKE_MEASURE)
    assert first == second
    assert first.budget_bytes == (15 * GIB - 2 * (700 * MIB + LIBRARIES)) // 2
    assert first.context_bytes == 700 * MIB + LIBRARIES
    assert first.total_bytes == 16 * GIB - 100 * MIB  # CUDA's total: what JAX's fraction is of
    assumed = GpuPlan(trials_per_gpu=2).shares((CARD,))[0]
    assert assumed.context_bytes is None
    assert assumed.budget_bytes == (16 * GIB - 2 * CONTEXT_RESERVE_MB * MIB) // 2


def test_a_slot_is_measured_only_where_all_its_gpus_were() -> None:
    other = Gpu("1", CARD.model, CARD.total_bytes)
    (share,) = GpuPlan(gpus_per_trial=2).shares((CARD, other), FAKE_MEASURE)
    assert share.context_bytes is None


def test_a_budget_that_cannot_fit_beside_measured_contexts_is_refused() -> None:
    with pytest.raises(UsageError, match=f"{700 + FRAMEWORK_LIBRARIES_MB} MiB each, measured"):
        GpuPlan(trials_per_gpu=2, gpu_memory_mb=7400).shares((CARD,), FAKE_MEASURE)


def test_the_measured_context_reaches_the_trial_process_through_its_environment() -> None:
    (share,) = GpuPlan().shares((CARD,), FAKE_MEASURE)
    assert GpuShare.from_environment(share.environment()) == share


def test_every_gpu_is_measured_once_and_one_that_fails_is_said_in_the_ready_line() -> None:
    def fake_probe_run(command: Sequence[str], env: dict[str, str]) -> str:
        device = env["CUDA_VISIBLE_DEVICES"]
        if device == "1":
            raise OSError("a fake's failure")
        return json.dumps(ContextMeasure(device, 300 * MIB, 15 * GIB, 16 * GIB).__dict__)

    measures = context_probe.measure_all(["0", "1", "0"], run=fake_probe_run)
    assert list(measures.found) == ["0"] and len(measures.missing) == 1
    line = measures.line()
    assert line.startswith("GPU 0: CUDA context 300 MiB measured, 15360 MiB usable; ")
    assert "GPU 1 was not measured" in line and line.endswith("(a context is assumed)")


def test_a_worker_measures_its_gpus_by_probe_processes_and_its_slots_use_the_measure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's parent over two fake GPUs (fake NVML, in this process): each GPU goes
    to the probe (a fake answering for GPU 0, and a real probe process for GPU 1, which
    finds no CUDA driver here); slots on GPU 0 use the measure, GPU 1's the assumption."""
    from trialq.settings import Settings
    from trialq.worker import state as worker_state

    fake_nvml.describe(tmp_path, count=2, total_bytes=16 * GIB)
    monkeypatch.setenv("FAKE_NVML_DIR", str(tmp_path))
    real_measure = context_probe.measure

    def fake_for_gpu_0(device: str, run: object = None, nvml_module: str = "") -> object:
        if device == "GPU-fake-0":  # the worker names its GPUs by UUID
            return dataclasses.replace(FAKE_MEASURE["0"], device=device)
        return real_measure(device, nvml_module=nvml_module)

    monkeypatch.setattr(context_probe, "measure", fake_for_gpu_0)
    settings = Settings(broker_url="redis://127.0.0.1:1/3", gpus="all", nvml_module="fake_nvml")
    worker = worker_state.WorkerState(settings)
    shares = worker.plan_gpus()
    assert [share.context_bytes for share in shares] == [700 * MIB + LIBRARIES, None]
    assert worker.gpu_measures is not None
    line = worker.gpu_measures.line()
    assert "GPU-fake-0: CUDA context 700 MiB measured" in line
    assert "GPU GPU-" not in line
    assert "GPU-fake-1 was not measured" in line


def test_the_allowance_holds_a_framework_context_as_an_h100_measured_it() -> None:
    """Readings of a real H100 (2026-11-27, README "GPU figures"), not a fake's answers: the
    probe's bare context 526 MiB; a JAX trial held by its own cap at a 2048 MiB budget held
    2586 MiB in all, which the bare context alone (2574 MiB) had the guard kill."""
    h100 = Gpu("GPU-h100", "NVIDIA H100 80GB HBM3", 85520809984)
    measured = {"GPU-h100": ContextMeasure("GPU-h100", 526 * MIB, 85017493504, 85520809984)}
    share = GpuPlan(trials_per_gpu=4, gpu_memory_mb=2048).shares((h100,), measured)[0]
    assert share.context_bytes is not None
    assert share.budget_bytes is not None
    assert share.budget_bytes + share.context_bytes > 2586 * MIB


def test_a_measured_context_below_the_assumed_one_never_lowers_it() -> None:
    """The probe's bare context is smaller than a framework's: a measure only raises it."""
    small = {"0": ContextMeasure("0", 300 * MIB, 15 * GIB, 16 * GIB)}
    (share,) = GpuPlan().shares((CARD,), small)
    assert share.context_bytes == CONTEXT_RESERVE_MB * MIB
    assert share.budget_bytes == 15 * GIB - CONTEXT_RESERVE_MB * MIB
