"""What a trial measured is declared once (`Measurements`): every field of it reaches the
worker's result, the trial's user attrs under its own name, the record read back and the
views' rows, with no list of fields anywhere to keep up. The fields are derived here, not
listed, so a reading added to the model is checked by these tests as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
from pydantic import TypeAdapter, ValidationError

from trialq.views.rows import trial_rows
from trialq.wire.entrypoint import EntrypointRef
from trialq.wire.messages import (
    GpuGuardFigures,
    Measurements,
    Outcome,
    TrialRequest,
    TrialResult,
)
from trialq.wire.record import TrialRecord, recorded_of

REQUEST = TrialRequest(
    study="s", number=3, attempt=1, params={"x": 1.0},
    entrypoint=EntrypointRef.parse("m:f"), timeout_s=60,
)  # fmt: skip

GUARD = GpuGuardFigures(
    device="0", own_bytes=9, reserved_bytes=4, allowance_bytes=2, budget_bytes=5
)
CANDIDATES: tuple[Any, ...] = (True, 7, 2.5, "seen", (1, 2), {"0": 3}, GUARD)
"""Values of every kind a reading takes; each field gets the first its type takes strictly."""


def _sample(name: str) -> Any:
    """A value for the field that is not its default, chosen by its declared type."""
    field = Measurements.model_fields[name]
    adapter: TypeAdapter[Any] = TypeAdapter(field.annotation)
    for candidate in CANDIDATES:
        try:
            value = adapter.validate_python(candidate, strict=True)
        except ValidationError:
            continue
        if value != field.get_default(call_default_factory=True):
            return value
    raise AssertionError(f"no sample value for Measurements.{name}: add one to CANDIDATES")


SAMPLE = Measurements(**{name: _sample(name) for name in Measurements.model_fields})


def test_every_measurement_reaches_the_result() -> None:
    result = TrialResult.here(REQUEST, Outcome.OK, None, SAMPLE, metrics={"loss": 0.5})
    for name in Measurements.model_fields:
        assert getattr(result, name) == getattr(SAMPLE, name), name


def test_every_measurement_is_stored_under_its_own_name_and_read_back() -> None:
    result = TrialResult.here(REQUEST, Outcome.OK, None, SAMPLE, metrics={"loss": 0.5})
    record = TrialRecord.told(result, task_id="t", attempts=1, retries=0, preemptions=0, gpus=1)
    attrs = json.loads(json.dumps(record.attrs()))  # as a storage keeps them
    assert set(Measurements.model_fields) <= set(attrs)
    again = TrialRecord.read(attrs)
    for name in Measurements.model_fields:
        assert getattr(again, name) == getattr(SAMPLE, name), name


def test_a_record_keeps_no_field_the_driver_alone_acts_on() -> None:
    """What only the driver reads of a result (its address, the checkpoint it removed, the
    artifacts it links) is not stored as a user attr."""
    recorded = recorded_of(TrialResult.here(REQUEST, Outcome.OK, None, SAMPLE))
    unrecorded = {"version", "study", "number", "attempt", "last_step", "device_refused",
                  "checkpoint_removed", "artifacts"}  # fmt: skip
    assert not unrecorded & set(recorded)
    assert set(recorded) == set(Measurements.model_fields) | {"outcome", "error", "metrics"}


def test_every_measurement_reaches_the_rows() -> None:
    result = TrialResult.here(REQUEST, Outcome.OK, None, SAMPLE, metrics={"loss": 0.5})
    record = TrialRecord.told(result, task_id="t", attempts=1, retries=0, preemptions=0, gpus=1)
    study = optuna.create_study()
    trial = study.ask()
    for key, value in record.attrs().items():
        trial.set_user_attr(key, value)
    study.tell(trial, 0.5)
    [row] = trial_rows(study)
    for name in Measurements.model_fields:
        assert getattr(row.record, name) == getattr(SAMPLE, name), name


PREVIOUS_VERSION_RESULT = {
    "version": 1, "study": "s", "number": 3, "attempt": 1, "outcome": "ok",
    "metrics": {"loss": "nan"}, "worker_pid": 11, "worker_host": "h", "duration_s": 1.5,
    "peak_rss_bytes": 100, "gpu_peak_bytes": None, "framework": "torch",
    "gpu_peaks_bytes": [5, 6], "gpu_budget_bytes": 7, "gpu_cap_applied": True,
    "gpu_cap_note": None, "gpu_model": "H100", "gpu_context_bytes": None,
    "gpu_memory_used_peak_bytes": 9, "gpu_utilization_mean": 50.0,
    "gpu_process_peak_bytes": {"0": 8}, "oom_caused_by_neighbour": False,
    "gpu_accounting": "nvml-pids", "gpu_accounting_note": None, "gpu_guard": None,
    "error": None, "last_step": 4, "reports_dropped": 0, "fitted_batch_size": None,
    "device_refused": False, "checkpoint_removed": True, "artifacts": [], "log_file": None,
}  # fmt: skip
"""A result as a worker of the version before `Measurements` wrote it (every field)."""


def test_a_result_of_the_previous_version_still_reads() -> None:
    result = TrialResult.model_validate_json(json.dumps(PREVIOUS_VERSION_RESULT))
    assert result.gpu_peaks_bytes == (5, 6) and result.checkpoint_removed
    assert result.worker_host == "h" and result.last_step == 4
    written = json.loads(result.model_dump_json())  # what a driver of that version reads
    assert {key: written[key] for key in PREVIOUS_VERSION_RESULT} == PREVIOUS_VERSION_RESULT


def test_an_untimed_result_still_says_a_duration_on_the_wire() -> None:
    """A driver of the previous version reads `duration_s` as a number, never null."""
    result = TrialResult.of(REQUEST, Outcome.ERROR, "lost")
    assert result.duration_s is None
    assert json.loads(result.model_dump_json())["duration_s"] == 0.0


def test_the_design_names_every_measurement_the_record_stores() -> None:
    """docs/design.md's list of the user attrs is held to the model, not to memory."""
    design = (Path(__file__).parents[2] / "docs" / "design.md").read_text()
    section = design.split("## What every finished trial records")[1].split("\n## ")[0]
    named = {name for name in TrialRecord.model_fields if f"`{name}`" in section}
    assert named == set(TrialRecord.model_fields)
