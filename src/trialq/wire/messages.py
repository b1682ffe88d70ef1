"""The messages between the driver and the trial process: typed, versioned, JSON.

A Celery task carries one `TrialRequest` and returns one `TrialResult`, both as plain JSON
objects. `version` lets an old worker and a new driver refuse each other clearly. A field
added with a default is a compatible change (an older reader ignores it, a newer one reads
its default from an older writer) and keeps the version; anything else bumps it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import socket
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, field_validator, model_validator

from trialq.wire.entrypoint import EntrypointRef
from trialq.wire.frameworks import FrameworkChoice
from trialq.wire.outcome import Outcome as Outcome

STUDY_KEY_PATTERN = r"^[0-9a-f]{16}$"
"""A study's key on the broker: 16 hex digits of a hash."""
CHECKPOINT_KEY_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}/[0-9]{1,12}-[0-9a-f]{6,32}$"
"""`<study>/<number>-<token>`: a path under a worker's checkpoint root, never outside it
(one `/`, and no part that starts with a dot; see `trialq.trial.checkpoints`)."""


def checkpoint_key(study: str, number: int) -> str:
    """A new trial's checkpoint key: its study's name made path-safe, its number, and a
    random token, so that a study deleted and made again never finds an old trial's files."""
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", study)[:200]
    if slug[0] in ".-":
        slug = "_" + slug[1:]
    return f"{slug}/{number}-{secrets.token_hex(6)}"


MESSAGE_VERSION: Literal[1] = 1

ParamValue = bool | int | float | str | None


def _metric_json(value: float) -> float | str:
    """A non-finite metric as the text float() reads back ("nan", "inf", "-inf"): JSON has
    no NaN, and pydantic would write null, which no reader takes for a number."""
    return value if math.isfinite(value) else str(value)


Metric = Annotated[float, PlainSerializer(_metric_json, when_used="json")]
"""A metric's value: a float, non-finite ones included, as text in JSON."""


def _non_finite_text(attrs: dict[str, Any]) -> str | None:
    """`attrs` as JSON text with NaN and Infinity where a value holds a non-finite float (JSON
    proper, and the wire, have none); None where JSON proper holds them all."""
    try:
        json.dumps(attrs, allow_nan=False)
    except ValueError:
        return json.dumps(attrs)
    return None


class _Message(BaseModel):
    # Fields added in a compatible change are ignored by an older reader; an incompatible
    # change bumps `version`, which an older reader refuses.
    model_config = ConfigDict(frozen=True, extra="ignore")

    version: Literal[1] = MESSAGE_VERSION


LAST_RUN_ATTR = "trialq:last_run"
"""The study user attr where the driver records what ended its last run and what each
budget used (`trialq status` reads it)."""

BROKER_ATTR = "trialq:broker"
"""The study user attr naming the broker its last run used (`local` for `--local`), so that
`trialq status` asks that one, or none, for live workers."""

ARTIFACTS_ATTR_PREFIX = "artifacts:"
"""The trial system attr key prefix `optuna.artifacts.upload_artifact` links a file with."""


class ArtifactMeta(BaseModel):
    """A file a trial stored in the artifact store: `optuna.artifacts.ArtifactMeta`'s fields."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    artifact_id: str = Field(pattern=r"^[0-9a-f-]{36}$")
    filename: str = Field(min_length=1, max_length=255)
    mimetype: str
    encoding: str | None = None


class MlflowTarget(BaseModel):
    """Where a trial process finds its MLflow run (`trial.mlflow_run_id`): the study's
    `[tracking.mlflow]` as the driver resolved it. The run itself is found by the request's
    study and number (`tracking/mlflow_runs.py`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tracking_uri: str | None = None
    """A relative file or SQLite path already made the spec folder's, absolute; None:
    the worker's own MLflow default (its `MLFLOW_TRACKING_URI`)."""
    experiment: str = Field(min_length=1)


class TrialRequest(_Message):
    """What the driver asks a worker to run: one attempt of one trial."""

    study: str
    number: int = Field(ge=0)
    attempt: int = Field(ge=1)
    params: dict[str, ParamValue]
    entrypoint: EntrypointRef
    timeout_s: float = Field(gt=0)
    """The soft limit: the trial is interrupted then and ends `timeout` (Celery's soft limit)."""
    hard_limit_s: float | None = Field(default=None, gt=0)
    """When the trial's process is killed: the soft limit plus the spec's grace. The
    dispatcher hands it to the queue (Celery's hard time limit); the trial never reads it.
    None only in a request from an older driver, which sent the limit beside the request: no
    hard limit but the worker's own then."""
    memory_limit_mb: int = Field(default=0, ge=0)
    checkpoint_key: str | None = Field(default=None, pattern=CHECKPOINT_KEY_PATTERN)
    """Where, under the worker's checkpoint root, this trial's `checkpoint_dir` is: the same
    for every attempt of the trial, and for no other trial (a random token per trial)."""
    keep_checkpoints: bool = False
    """The spec's `[trial] keep_checkpoints`: the final attempt leaves its folder in place."""
    preemptions: int = Field(default=0, ge=0)
    """How many earlier attempts of this trial were preempted (the driver's count)."""
    framework: FrameworkChoice = "auto"
    """The spec's `[trial] framework`: whose environment, memory cap and peaks the trial
    process sets and reads (`trialq.trial.frameworks`); `auto` finds it from the entrypoint."""
    cpus: int | None = Field(default=None, ge=1)
    """The spec's `[trial] cpus`: the trial's library threads; None: the worker's share."""
    mlflow: MlflowTarget | None = None
    """The study's MLflow run store where it tracks with MLflow; None: it does not (or an
    older driver sent it), and `trial.mlflow_run_id` is None."""
    signature: str | None = None
    """The driver's signature of every other field and the task id, under the deployment's
    secret (`trialq.wire.signing.Seal.sign_task`); a worker with the secret runs no request
    without a good one. Set as the request is sent, never read from this model."""
    study_key: str | None = Field(default=None, pattern=STUDY_KEY_PATTERN)
    """The study's identity on the broker: its storage and its id there, hashed
    (`trialq.driver.study.study_key`). The attempt's report keys are named by it, not by the
    study's name, which two storages may both hold. None: an older driver's request."""

    def what_ran(self) -> str:
        """The digest of what this request runs (its study, number, attempt, params and
        entrypoint), which its result names: the driver tells a result only for the request
        it sent."""
        ran = [self.study, self.number, self.attempt, self.params, str(self.entrypoint)]
        text = json.dumps(ran, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    suggests: bool = False
    """The trial's function takes the trial alone and draws its own params with
    `trial.suggest_*` (an Optuna objective); False: it takes `params` drawn by the driver."""
    distributions: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Where `suggests`: the distribution each param in `params` was drawn from, as
    Optuna's JSON; a suggest of one of them with the same distribution needs no driver."""
    code: str | None = None
    """The trial function itself, where it was defined in `__main__` or a notebook: base64
    of cloudpickle's bytes (`trialq.wire.carried_code`); None: `entrypoint` is imported."""
    code_signature: str | None = None
    """`code`'s signature with the cluster's secret, put on by the dispatcher; a worker
    unpickles nothing that does not verify."""
    answers_signed: bool = False
    """The driver signs its answers (it holds the cluster's secret), put on by the dispatcher:
    a trial that holds the secret then takes no unsigned answer. Without it, answers are taken
    as results are then, unauthenticated."""
    answers: bool = False
    """The driver answers this attempt's questions (`trialq.wire.suggest`): a suggest of a
    param not carried, and `should_prune()`'s verdict on the step just reported. False from
    an older driver: the trial reads the prune flag only."""

    @model_validator(mode="after")
    def _killed_after_the_soft_limit(self) -> TrialRequest:
        if self.hard_limit_s is not None and self.hard_limit_s <= self.timeout_s:
            raise ValueError(
                f"hard_limit_s ({self.hard_limit_s:g}) must be past timeout_s "
                f"({self.timeout_s:g}): a process killed first never times out"
            )
        return self


class GpuGuardFigures(BaseModel):
    """What trialq's GPU memory guard killed a trial for, on one of its GPUs: NVML's figure
    of the trial's processes, its framework's reserved bytes then (None: no framework held
    any), the allowance for memory outside the allocator, and the trial's budget."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    device: str
    own_bytes: int
    reserved_bytes: int | None
    allowance_bytes: int
    budget_bytes: int

    @property
    def outside_bytes(self) -> int:
        """What the trial held outside its framework's allocator (a context among it)."""
        return self.own_bytes - (self.reserved_bytes or 0)


def _seconds_json(value: float | None) -> float:
    """No duration as 0 in JSON, as every reader before `Measurements` read one (a driver of
    the previous version takes no null there)."""
    return 0.0 if value is None else value


Seconds = Annotated[float | None, PlainSerializer(_seconds_json, when_used="json")]


class Measurements(BaseModel):
    """What a trial's process measured of its attempt, and where it ran: declared here
    once. `TrialResult` extends it (the worker's report), `trialq.wire.record.TrialRecord`
    extends it (the trial's user attrs, each field under its own name), and the views and
    the trackers read it from the record. A reading added here is carried, stored and read
    back with nothing else to change (tests/unit/test_measurements.py)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    worker_pid: int | None = None
    worker_host: str | None = None
    duration_s: Seconds = None
    """How long the attempt ran; None: not timed (its process never ran it), 0 in JSON."""
    peak_rss_bytes: int | None = None
    gpu_peak_bytes: int | None = None
    """The largest of `gpu_peaks_bytes` (before frameworks: TensorFlow's peak on GPU:0)."""
    framework: str | None = None
    """The framework the trial ran on (`torch`, `tensorflow`, `jax`), or None if none found."""
    gpu_peaks_bytes: tuple[int, ...] | None = None
    """The framework allocator's peak on each of the trial's GPUs, in CUDA's order (None
    without a GPU, or before the framework's runtime ran). The CUDA context is not in it."""
    gpu_budget_bytes: int | None = None
    """What the trial might hold on each of its GPUs (its share), or None: no budget."""
    gpu_cap_applied: bool = False
    """Whether the framework was held to the budget before the trial's first op."""
    gpu_cap_note: str | None = None
    """Why the cap was not applied (or came late in part), in words; None when it held."""
    gpu_model: str | None = None
    """The model of the trial's GPUs, as NVML names it, where the worker knew it."""
    gpu_context_bytes: int | None = None
    """One CUDA context on the trial's GPUs as its worker measured it at its start (the
    guard allows the budget plus this); None: not measured, a context was assumed."""
    gpu_memory_used_peak_bytes: int | None = None
    """Peak of NVML's memory in use on the trial's device (None without NVML)."""
    gpu_utilization_mean: float | None = None
    """Mean of NVML's utilisation, percent, sampled while the trial ran."""
    gpu_process_peak_bytes: dict[str, int] = Field(default_factory=dict)
    """Per GPU of a worker's slot (as CUDA names it): the most NVML counted for the trial's
    processes, its CUDA contexts included, while its GPU memory guard sampled."""
    oom_caused_by_neighbour: bool = False
    """An `oom` that the trial's neighbours on a shared GPU caused: the trial stayed within
    its budget while they held part of it. Re-sent, never told to the sampler."""
    gpu_accounting: str | None = None
    """Where the GPU memory guard's figure of the trial's own memory came from on a shared GPU:
    `nvml-pids`, `framework` (its allocator's, plus a CUDA context) or `unguarded` (one per
    GPU where they differ); None without a slot's GPUs (docs/oom.md)."""
    gpu_accounting_note: str | None = None
    """What the start check and the guard could not attribute or read, in words (memory no
    process could be named for at the start, a GPU left unguarded, NVML failing); None: none."""
    gpu_guard: GpuGuardFigures | None = None
    """For a `gpu_guard` kill: the figures it was killed for (docs/oom.md)."""
    reports_dropped: int = 0
    """Intermediate values the attempt reported that the driver never got (past the bound
    of `trialq.trial.report_sender.MAX_REPORTS_PER_ATTEMPT`, or lost while Redis was away)."""
    fitted_batch_size: int | None = None
    """The batch size `trial.fit_batch_size` found for the trial (None: it was not called)."""
    log_file: str | None = None
    """The attempt's own log on its worker's host (`worker/attempt_log.py`), where the
    worker writes one (`TRIALQ_TRIAL_LOG_DIR`; `--local` does)."""


def measured_fields(*parts: Measurements) -> dict[str, Any]:
    """The fields each part set, later parts over earlier ones: one attempt's measurements
    as its sources (the host, the framework, NVML, the trial's context) each took theirs."""
    return {name: getattr(part, name) for part in parts for name in part.model_fields_set}


class TrialResult(_Message, Measurements):
    """What a trial process reports when it ends, whatever the outcome: its address, how it
    ended, what it measured (`Measurements`), and what only the driver acts on."""

    study: str
    number: int
    attempt: int
    outcome: Outcome
    metrics: dict[str, Metric] = Field(default_factory=dict)
    error: str | None = None
    last_step: int | None = None
    device_refused: bool = False
    """The trial did not run: its worker's device still held an earlier trial's memory.
    Not the params' fault, so the driver sends it elsewhere (within max_retries)."""
    checkpoint_removed: bool = False
    """The trial process removed the trial's checkpoint folder (its outcome was final); the
    driver asks a later trial process to remove it when not (docs/preemption.md)."""
    artifacts: tuple[ArtifactMeta, ...] = ()
    """Files the trial stored with `trial.save_artifact`: the meta the driver links to the
    trial as `optuna.artifacts.upload_artifact` does (workers never touch the storage)."""
    ran: str | None = None
    """What the attempt ran (`TrialRequest.what_ran`); None from an older worker. For the
    driver alone: not stored on the trial."""
    user_attrs: dict[str, Any] = Field(default_factory=dict)
    """What the trial set with `trial.set_user_attr` (JSON values), each stored on the trial
    under its own name, as Optuna's `Trial.set_user_attr` stores it. JSON has no NaN or
    infinity: on the wire a non-finite float here reads as null (`user_attrs_text` keeps it)."""
    user_attrs_text: str | None = None
    """`user_attrs` as Python's `json` writes it, NaN and Infinity kept, sent only where a value
    holds a non-finite float: the driver stores from it (`told_user_attrs`), so a NaN stays NaN
    as in Optuna's own storages; a reader from before it takes the nulls of `user_attrs`."""

    @classmethod
    def of(cls, request: TrialRequest, outcome: Outcome, error: str | None = None) -> TrialResult:
        """The result of an attempt with nothing measured: what the driver tells for an
        attempt whose process returned none of its own."""
        return cls._for(request, outcome, error)

    @classmethod
    def here(
        cls,
        request: TrialRequest,
        outcome: Outcome,
        error: str | None = None,
        *measured: Measurements,
        metrics: dict[str, float] | None = None,
        last_step: int | None = None,
        artifacts: tuple[ArtifactMeta, ...] = (),
        user_attrs: dict[str, Any] | None = None,
    ) -> TrialResult:
        """The result of an attempt, from the process that ran it (its pid and host), with
        what each of its sources measured."""
        here = Measurements(worker_pid=os.getpid(), worker_host=socket.gethostname())
        return cls._for(
            request, outcome, error, **measured_fields(here, *measured),
            metrics=metrics or {}, last_step=last_step, artifacts=artifacts,
            user_attrs=user_attrs or {}, user_attrs_text=_non_finite_text(user_attrs or {}),
        )  # fmt: skip

    @field_validator("user_attrs_text")
    @classmethod
    def _an_object(cls, text: str | None) -> str | None:
        """A text that is no JSON object makes the result no result (set aside when read),
        rather than an error where the driver tells it."""
        if text is not None:
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise ValueError("user_attrs_text is not a JSON object")
        return text

    def told_user_attrs(self) -> dict[str, Any]:
        """The user attrs to store on the trial: as the trial set them, non-finite floats too."""
        if self.user_attrs_text is None:
            return dict(self.user_attrs)
        kept: dict[str, Any] = json.loads(self.user_attrs_text)
        return kept

    @classmethod
    def _for(
        cls, request: TrialRequest, outcome: Outcome, error: str | None, **fields: Any
    ) -> TrialResult:
        """The one constructor both go through: the attempt's address, how it ended, the rest."""
        return cls(
            study=request.study, number=request.number, attempt=request.attempt,
            outcome=outcome, error=error, ran=request.what_ran(), **fields,
        )  # fmt: skip

    @classmethod
    def device_refused_here(cls, request: TrialRequest, reason: str) -> TrialResult:
        """The result of an attempt not run: its device held what no trial of this worker
        did (`device_refused`)."""
        return cls.here(request, Outcome.ERROR, reason).model_copy(update={"device_refused": True})

    def failed_as(self, outcome: Outcome, error: str) -> TrialResult:
        """This result, ended another way: the driver's reading of it (no objective, a
        spec that names none, a neighbour's OOM past its bound)."""
        return self.model_copy(update={"outcome": outcome, "error": error})

    def with_error(self, error: str) -> TrialResult:
        """This result, its error text replaced (what was given up on, added)."""
        return self.model_copy(update={"error": error})

    def measured_also(self, *measured: Measurements) -> TrialResult:
        """This result with more of what its attempt measured, as `here` takes it: the host
        memory the driver knows it peaked at, what the GPU memory guard saw."""
        return self.model_copy(update=measured_fields(*measured))

    def with_checkpoint_removed(self, removed: bool) -> TrialResult:
        """This result, saying whether its process removed the trial's checkpoint folder."""
        return self.model_copy(update={"checkpoint_removed": removed})

    def unstorable(self, error: str) -> TrialResult:
        """This result as `error` without its metrics: it was too large to store."""
        return self.model_copy(update={"outcome": Outcome.ERROR, "metrics": {}, "error": error})
