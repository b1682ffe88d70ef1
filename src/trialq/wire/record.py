"""What a trial stores on Optuna: `TrialRecord`, its user attrs as one typed value.

The driver writes a trial's record (a part when it sends it, the whole when it tells it) and
reads it back when it re-attaches; `trialq status`, `report` and the `--json` summary read
it too. Both sides go through this one model (docs/design.md, "What every finished trial
records"), never through string keys of their own. Every field has a default: a record is
written in parts, and one an older trialq wrote lacks the newer fields. What a trial
measured is `Measurements`, declared once in `trialq.wire.messages` and extended here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from trialq.wire.messages import Measurements, Metric, TrialResult
from trialq.wire.outcome import Outcome

SUMMARY_FIELDS = (
    "outcome", "attempts", "retries", "preemptions", "worker_host", "duration_s",
    "peak_rss_bytes", "gpu_peak_bytes", "gpu_memory_used_peak_bytes", "framework",
    "gpu_model", "error",
)  # fmt: skip
"""The fields of a record every tracker records beside the trial's values and metrics."""


def recorded_of(result: TrialResult) -> dict[str, Any]:
    """What of a result a trial's record keeps, as JSON: every field the two share (what
    it measured, its outcome, error and metrics), no list of its own."""
    return result.model_dump(mode="json", include=set(TrialRecord.model_fields))


def _is_scalar(value: object) -> bool:
    return isinstance(value, str | int | float)


class TrialRecord(Measurements):
    """A trial's user attrs: what its attempt measured (`Measurements`, each field under its
    own name), how it ended, and what the driver recorded of sending it. `attrs()` is what
    is written: the fields set, no others."""

    outcome: str | None = None
    """An `Outcome`'s value (`known_outcome`); text, so one a newer trialq wrote reads too."""
    error: str | None = None
    metrics: dict[str, Metric] | None = None
    task_id: str | None = None
    attempts: int | None = None
    retries: int | None = None
    preemptions: int | None = None
    checkpoint_key: str | None = None
    gpus: int | None = None

    @classmethod
    def told(
        cls,
        result: TrialResult,
        *,
        task_id: str,
        attempts: int,
        retries: int,
        preemptions: int,
        gpus: int,
        log_file: str | None = None,
    ) -> TrialRecord:
        """The whole record of a trial told with `result`; `log_file`, the attempt's own log
        as the driver last read it, where the result names none (its process wrote none)."""
        sent = {"attempts": attempts, "task_id": task_id, "retries": retries}
        more = {"preemptions": preemptions, "gpus": gpus}
        logged = {"log_file": result.log_file or log_file}
        return cls.model_validate({**recorded_of(result), **sent, **more, **logged})

    @classmethod
    def read(cls, attrs: Mapping[str, Any]) -> TrialRecord:
        """A stored record; a field that does not read as its type is left out, not fatal
        (a person may set user attrs too)."""
        try:
            return cls.model_validate(attrs)
        except ValidationError as exc:
            bad = {error["loc"][0] for error in exc.errors() if error["loc"]}
            return cls.model_validate({k: v for k, v in attrs.items() if k not in bad})

    @staticmethod
    def outcome_in(attrs: Mapping[str, Any]) -> Outcome | None:
        """The outcome a stored record names, read alone (for every trial of a study)."""
        return Outcome.read(attrs.get("outcome"))

    def summary(self) -> dict[str, str | int | float]:
        """How the trial ran, as every tracker records it: the `SUMMARY_FIELDS` set."""
        shown = self.model_dump(include=set(SUMMARY_FIELDS))
        return {name: shown[name] for name in SUMMARY_FIELDS if _is_scalar(shown[name])}

    def attrs(self) -> dict[str, Any]:
        """The user attrs to write: the fields set, as JSON."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def known_outcome(self) -> Outcome | None:
        """The outcome recorded, if this version knows it."""
        return Outcome.read(self.outcome)

    @property
    def ran_on_a_gpu(self) -> bool:
        """Whether the trial's record holds any GPU reading: its slot's model or budget, its
        framework's peaks on a GPU, NVML's peak. A trial of a CPU-only worker has none."""
        readings = (self.gpu_model, self.gpu_budget_bytes, self.gpu_peaks_bytes,
                    self.gpu_memory_used_peak_bytes)  # fmt: skip
        return any(reading is not None for reading in readings)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours the trial used: its duration times its GPUs (one unless recorded); 0
        for a trial that ran on no GPU (`max_gpu_hours` counts GPUs, not trials)."""
        if not self.ran_on_a_gpu:
            return 0.0
        gpus = 1 if self.gpus is None else self.gpus
        return (self.duration_s or 0.0) * gpus / 3600

    @property
    def gpu_peak(self) -> int | None:
        """NVML's peak in use (the whole footprint) where sampled, else the framework's."""
        used = self.gpu_memory_used_peak_bytes
        return used if used is not None else self.gpu_peak_bytes
