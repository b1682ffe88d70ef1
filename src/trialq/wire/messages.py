"""The messages between the driver and the trial process: typed, versioned, JSON.

A Celery task carries one `TrialRequest` and returns one `TrialResult`, both as plain JSON
objects. `version` lets an old worker and a new driver refuse each other clearly.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trialq.wire.entrypoint import EntrypointRef

MESSAGE_VERSION: Literal[1] = 1

ParamValue = str | int | float | bool | None


class Outcome(StrEnum):
    """How a trial ended. Only `ok` completes a trial; only `worker_lost` is retried."""

    OK = "ok"
    PRUNED = "pruned"
    OOM = "oom"
    TIMEOUT = "timeout"
    ERROR = "error"
    WORKER_LOST = "worker_lost"
    STOPPED = "stopped"
    """Finished from outside while it ran (optuna-dashboard's Fail, the `optuna` CLI): the
    state told there stands, the process is killed, the trial is not retried."""

    @property
    def is_retryable(self) -> bool:
        """Whether the same params deserve another run (the failure was not theirs)."""
        return self is Outcome.WORKER_LOST


class _Message(BaseModel):
    # Fields added in a compatible change are ignored by an older reader; an incompatible
    # change bumps `version`, which an older reader refuses.
    model_config = ConfigDict(frozen=True, extra="ignore")

    version: Literal[1] = MESSAGE_VERSION


class TrialRequest(_Message):
    """What the driver asks a worker to run: one attempt of one trial."""

    study: str
    number: int = Field(ge=0)
    attempt: int = Field(ge=1)
    params: dict[str, ParamValue]
    entrypoint: EntrypointRef
    timeout_s: float = Field(gt=0)
    memory_limit_mb: int = Field(default=0, ge=0)
    search_paths: tuple[str, ...] = ()
    """Folders put on `sys.path` before importing the entrypoint (the spec's, in --local)."""


class TrialResult(_Message):
    """What a trial process reports when it ends, whatever the outcome."""

    study: str
    number: int
    attempt: int
    outcome: Outcome
    metrics: dict[str, float] = Field(default_factory=dict)
    worker_pid: int | None = None
    worker_host: str | None = None
    duration_s: float = 0.0
    peak_rss_bytes: int | None = None
    gpu_peak_bytes: int | None = None
    gpu_memory_used_peak_bytes: int | None = None
    """Peak of NVML's memory in use on the trial's device (None without NVML)."""
    gpu_utilization_mean: float | None = None
    """Mean of NVML's utilisation, percent, sampled while the trial ran."""
    error: str | None = None
    last_step: int | None = None
    device_refused: bool = False
    """The trial did not run: its worker's device still held an earlier trial's memory.
    Not the params' fault, so the driver sends it elsewhere (within max_retries)."""

    def user_attrs(self) -> dict[str, Any]:
        """The fields recorded on the Optuna trial (docs/design.md, 'What every trial records')."""
        internal = {"version", "study", "number", "attempt", "last_step", "device_refused"}
        return self.model_dump(mode="json", exclude=internal)
