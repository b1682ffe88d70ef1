"""The study spec: a TOML (or YAML) file parsed into frozen, checked objects.

Every mistake is reported before anything is enqueued, as one `SpecError` line that names
the file, the key and what was expected.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from trialq.errors import SpecError
from trialq.limits import EXACT_INT_MAX, GRID_POINTS_MAX, INT32_MAX, SECONDS_MAX
from trialq.tracking.config import TrackingSection
from trialq.wire.entrypoint import EntrypointRef
from trialq.wire.frameworks import FrameworkChoice
from trialq.wire.keys import DEFAULT_QUEUE

Direction = Literal["maximize", "minimize"]
SamplerName = Literal["auto", "tpe", "gp", "gp+tpe", "random", "cmaes", "nsga2", "grid"]
PrunerName = Literal["none", "median", "hyperband", "successive_halving"]


class _Frozen(BaseModel):
    # No float of a spec is NaN or infinite: Optuna, the storage and the clocks cannot hold
    # one, and a goal of NaN is never reached.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, allow_inf_nan=False)


Count = Annotated[int, Field(le=INT32_MAX)]
"""A number of things (trials, retries, GPUs, MB): within what the storage holds."""
Seconds = Annotated[float, Field(gt=0, le=SECONDS_MAX)]
"""A time a spec gives: positive, and within what Python's clocks and locks take."""
ExactInt = Annotated[int, Field(ge=-EXACT_INT_MAX, le=EXACT_INT_MAX)]
"""An int parameter's bound or step: exact as the double Optuna stores it."""


class FloatParam(_Frozen):
    """A float in [low, high], optionally on a log scale or a step grid."""

    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_bounds(self) -> FloatParam:
        _check_low_high(self.low, self.high)
        if self.high - self.low == float("inf"):
            raise ValueError(f"high - low overflows a float ({self.low:g} to {self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError("log = true needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("log and step exclude each other")
        _check_points(self.points)
        return self

    @property
    def points(self) -> int | None:
        """How many values its step grid has; None without a step (continuous)."""
        if self.step is None:
            return None
        return math.floor(min((self.high - self.low) / self.step, sys.float_info.max)) + 1


class IntParam(_Frozen):
    """An integer in [low, high] with a step, optionally on a log scale."""

    type: Literal["int"]
    low: ExactInt
    high: ExactInt
    log: bool = False
    step: Annotated[ExactInt, Field(gt=0)] = 1

    @model_validator(mode="after")
    def _check_bounds(self) -> IntParam:
        _check_low_high(self.low, self.high)
        if self.log and self.low <= 0:
            raise ValueError("log = true needs low > 0")
        return self

    @property
    def points(self) -> int:
        """How many values it can take."""
        return (self.high - self.low) // self.step + 1


class CategoricalParam(_Frozen):
    """One of a non-empty list of choices (str, int, float or bool)."""

    type: Literal["categorical"]
    choices: tuple[str | int | float | bool, ...] = Field(min_length=1)

    @field_validator("choices")
    @classmethod
    def _distinct(cls, choices: tuple[str | int | float | bool, ...]) -> tuple[Any, ...]:
        # Optuna finds a value's choice with `==`: of 1, 1.0 and True only the first is ever
        # told, and a choice given twice weighs double in every sampler.
        for index, choice in enumerate(choices):
            if choice in choices[:index]:
                raise ValueError(f"{choice!r} is given twice (1, 1.0 and true are one choice)")
        return choices


ParamSpec = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


def _check_low_high(low: float, high: float) -> None:
    if low > high:
        raise ValueError(f"low ({low}) must not be greater than high ({high})")


def _check_points(points: int | None) -> None:
    if points is not None and points > GRID_POINTS_MAX:
        raise ValueError(f"step gives over 2**53 values ({points:.3g}): use a larger step")


STUDY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
STUDY_NAME_MAX = 128


class StudySection(_Frozen):
    """`[study]`: what to optimise and how to search."""

    name: str = Field(min_length=1, max_length=STUDY_NAME_MAX)
    """Letters, digits, `_`, `.` and `-`, not starting with `.` or `-` (`STUDY_NAME`): it
    names the SQLite file beside the spec and its lock, and is part of Redis keys, so it can
    neither leave the spec's folder (`../x`, `a/b`, `a%2Fb`, `a?b` in a URL) nor fail to be
    a file's name."""
    direction: Direction | None = None
    directions: tuple[Direction, ...] | None = Field(default=None, min_length=1)
    metric: str | None = None
    metrics: tuple[str, ...] | None = Field(default=None, min_length=1)
    n_trials: Count = Field(gt=0)
    max_in_flight: Count | None = Field(default=None, gt=0)
    ask_ahead: Count = Field(default=0, ge=0)
    """Trials asked before there is room for them, so a slow ask (GP: up to seconds) delays
    no trial's start: each is asked with one result fewer, as one more in flight would be.
    Unsent at the run's end, they go back to the study as WAITING, params kept."""
    ask_processes: Count = Field(default=0, ge=0)
    """Processes that ask TPE for the next trials' params beside the driver, each from its own
    copy of the study (`trialq.driver.asking`): for a driver that must tell more trials a
    second than one core asks. 0: the driver asks every trial itself."""
    sampler: SamplerName = "auto"
    sampler_args: dict[str, Any] = Field(default_factory=dict)
    pruner: PrunerName = "median"
    pruner_args: dict[str, Any] = Field(default_factory=dict)
    storage: str | None = None
    search_space: EntrypointRef | None = None
    oom_as_constraint: bool = True
    outage_limit_s: Seconds = 300
    """Seconds the driver waits for a lost broker or storage before it gives up (exit 3)."""
    max_failures_in_a_row: Count = Field(default=5, ge=0)
    """Trials in a row that fail the same way (error, crash, lost worker, a worker's
    refusal) before the run stops with the rest of the budget kept; 0 never stops."""
    max_wall_s: Seconds | None = None
    """This run's wall time: once reached, no trial is sent (`trialq.driver.budget`)."""
    max_wall_hard: bool = False
    """At `max_wall_s`, stop the trials in flight too, for a later run to send again."""
    max_gpu_hours: float | None = Field(default=None, gt=0)
    """The study's finished trials' duration x `[trial] gpus`, summed over every run."""
    goal: float | None = None
    """Stop once the best value reaches it (one objective only)."""
    max_failed_trials: Count | None = Field(default=None, ge=1)
    """The study's failed trials at which the run stops (exit 5), the rest kept."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        if not STUDY_NAME.fullmatch(name):
            raise ValueError(
                f"{name!r}: use letters, digits, '_', '.' and '-', not starting with '.' or "
                "'-' (the name is a file's beside the spec)"
            )
        return name

    @model_validator(mode="after")
    def _check_objectives(self) -> StudySection:
        if self.direction and self.directions:
            raise ValueError("give direction or directions, not both")
        if self.goal is not None and self.directions and len(self.directions) > 1:
            raise ValueError("goal: a study with several objectives has no one best value")
        if self.metric and self.metrics:
            raise ValueError("give metric or metrics, not both")
        if self.metrics and len(self.metrics) != len(self.objective_directions):
            raise ValueError(
                f"metrics has {len(self.metrics)} names but there are "
                f"{len(self.objective_directions)} directions"
            )
        if len(self.objective_directions) > 1 and not self.metrics:
            raise ValueError("a multi-objective study needs metrics = [...], one per direction")
        return self

    @property
    def objective_directions(self) -> tuple[Direction, ...]:
        """The study's directions, one per objective (default: maximize)."""
        if self.directions:
            return self.directions
        return (self.direction or "maximize",)

    @property
    def objective_metrics(self) -> tuple[str, ...] | None:
        """The metric names that are the objectives, or None for a lone returned value."""
        if self.metrics:
            return self.metrics
        return (self.metric,) if self.metric else None


class TrialSection(_Frozen):
    """`[trial]`: what each worker runs and under which limits."""

    entrypoint: EntrypointRef
    timeout_s: Seconds = 3600
    max_retries: Count = Field(default=2, ge=0)
    retry_crashes: bool = False
    """Whether a trial whose process ended on its own (a signal, `sys.exit`) while its worker
    lived is re-sent, within `max_retries`; by default it is the trial's end (`crashed`)."""
    max_preemptions: Count = Field(default=20, ge=0)
    """Re-sends of a trial whose attempt was preempted (counted apart from `max_retries`:
    a reclaimed spot node says nothing about the trial's params)."""
    keep_checkpoints: bool = False
    """Leave each trial's `checkpoint_dir` on the workers' volume after it finished."""
    queue: str = Field(default=DEFAULT_QUEUE, min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")
    memory_limit_mb: Count = Field(default=0, ge=0)
    gpus: Count = Field(default=1, ge=1)
    """GPUs each trial gets, of its own: only a worker whose slots span this many takes it."""
    gpu_memory_mb: Count = Field(default=0, ge=0)
    """GPU memory one trial needs on each of its GPUs; a worker slot with less never takes
    it (docs/design.md, "Routing by GPU"). 0: any slot."""
    kill_grace_s: Seconds = 60
    """Seconds between the soft time limit (seen by the trial) and the kill of its process."""
    prune_grace_s: Seconds = 30
    """Seconds a trial has to honour `should_prune()` before its process is killed."""
    framework: FrameworkChoice = "auto"
    """`auto` | `torch` | `tensorflow` | `jax`: whose memory settings, cap and peaks the trial
    process uses (docs/frameworks.md); `auto` finds it from the entrypoint's imports."""
    cpus: Count | None = Field(default=None, ge=1)
    """CPU threads each trial's libraries use (PyTorch, OpenMP, MKL, TensorFlow, XLA); unset:
    its worker's cores divided among its slots (`trialq.worker.threads`)."""

    @property
    def hard_limit_s(self) -> float:
        """When the trial's process is killed: the soft limit plus a grace period."""
        return self.timeout_s + self.kill_grace_s


class StudySpec(_Frozen):
    """A whole spec file: the study, the trial, and the search space."""

    path: Path
    study: StudySection
    trial: TrialSection
    space: dict[str, ParamSpec] = Field(default_factory=dict)
    enqueue: tuple[dict[str, str | int | float | bool], ...] = ()
    """`[[enqueue]]` tables: known params to run first (Optuna's `enqueue_trial`), each
    sent once however many times the study is run."""
    tracking: TrackingSection = Field(default_factory=TrackingSection)
    """`[tracking]`: where each told trial is also recorded (MLflow, W&B, TensorBoard)."""
    _origin: str | None = PrivateAttr(default=None)
    _carried: str | None = PrivateAttr(default=None)
    _carried_source: str | None = PrivateAttr(default=None)

    @property
    def carried_code(self) -> str | None:
        """The trial function as code (`trialq.wire.carried_code`), where the Python API was
        given one defined in `__main__`; None: the entrypoint is imported by name."""
        return self._carried

    def carrying(self, payload: str, source_hash: str) -> StudySpec:
        """This spec, its trial function carried as `payload` (its source's hash: what
        tells this function from another of the same name)."""
        spec = self.model_copy()
        spec._carried, spec._carried_source = payload, source_hash
        return spec

    @property
    def trial_identity(self) -> str:
        """What the study records of its trial function, and a re-run compares: the
        entrypoint, and for a function carried as code its source's hash too."""
        entrypoint = str(self.trial.entrypoint)
        return f"{entrypoint} (source {self._carried_source})" if self._carried else entrypoint

    @model_validator(mode="after")
    def _check_space(self) -> StudySpec:
        if self.space and self.study.search_space:
            raise ValueError("give [space.*] or study.search_space, not both")
        for params in self.enqueue:
            unknown = sorted(set(params) - set(self.space)) if self.space else []
            if unknown:
                raise ValueError(f"enqueue: {', '.join(unknown)} not in [space.*]")
            inexact = sorted(name for name, value in params.items() if _inexact(value))
            if inexact:
                raise ValueError(f"enqueue: {', '.join(inexact)}: an int past 2**53")
        return self

    @property
    def trial_suggests(self) -> bool:
        """No `[space.*]` and no `study.search_space`: the trial function draws its own
        params (`trial.suggest_*`, an Optuna objective taking the trial alone), answered by
        the driver's sampler (docs/design.md, "The Python API")."""
        return not self.space and self.study.search_space is None

    @property
    def directory(self) -> Path:
        """The folder the spec lives in: relative paths in it are taken from here."""
        return self.path.parent

    @property
    def where(self) -> str:
        """What an error about the spec names first: its file, or the call that built it
        (`trialq.optimize()`, whose `path` is a file's name that need not exist)."""
        return self._origin or str(self.path)


def _inexact(value: str | int | float | bool) -> bool:
    """An int the double Optuna stores a parameter as cannot hold exactly."""
    return isinstance(value, int) and abs(value) > EXACT_INT_MAX


def load_spec(path: Path) -> StudySpec:
    """Read and check a spec file; raise `SpecError` naming the file and the key."""
    return spec_from_mapping(_read_mapping(path), path)


KeyNamer = Callable[[tuple[int | str, ...]], str]
"""How an error names a key: a dotted TOML key (`study.n_trials`) by default."""


def spec_from_mapping(
    raw: Mapping[str, Any],
    path: Path,
    origin: str | None = None,
    key_name: KeyNamer | None = None,
) -> StudySpec:
    """Check a spec's tables as a file's (`path` anchors its relative paths); a mistake is one
    `SpecError` line naming `origin` (default: the file) and the key, as `key_name` names it."""
    where = origin or str(path)
    if "path" in raw:
        raise SpecError(f"{where}: path: unknown key")
    try:
        spec = StudySpec.model_validate({**raw, "path": path.resolve()})
    except ValidationError as exc:
        raise SpecError(f"{where}: {_first_problem(exc, key_name)}") from None
    spec._origin = origin
    entrypoint_key = key_name(("trial", "entrypoint")) if key_name else "trial.entrypoint"
    if spec.trial.entrypoint.target != "__main__":  # a function carried as code: no import
        spec.trial.entrypoint.check_importable(spec.directory, f"{where}: {entrypoint_key}")
    if spec.study.search_space:
        space_key = key_name(("study", "search_space")) if key_name else "study.search_space"
        spec.study.search_space.check_importable(spec.directory, f"{where}: {space_key}")
    return spec


def _read_mapping(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the spec: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text) if path.suffix in {".yaml", ".yml"} else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        first_line = str(exc).strip().splitlines()[0]
        raise SpecError(f"{path}: not valid {_format_name(path)}: {first_line}") from None
    if not isinstance(data, Mapping):
        raise SpecError(f"{path}: expected a table of [study], [trial] and [space.*] keys")
    return data


def _format_name(path: Path) -> str:
    return "YAML" if path.suffix in {".yaml", ".yml"} else "TOML"


def _first_problem(exc: ValidationError, key_name: KeyNamer | None = None) -> str:
    """One line for the first validation error: the dotted key, then what was expected. A
    misspelt key comes first, with the key it is close to (`n_trails`: did you mean
    n_trials?), rather than the "missing" error that the misspelling also causes."""
    errors = exc.errors()
    typos = [(e, _close_key(e["loc"])) for e in errors if e["type"] == "extra_forbidden"]
    error, suggestion = next(((e, s) for e, s in typos if s), (_first_error(errors), None))
    loc = tuple(_without_union_tags(error["loc"]))
    key = key_name(loc) if key_name else ".".join(str(part) for part in loc)
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = f"unknown key (did you mean {suggestion}?)" if suggestion else "unknown key"
    elif error["type"] == "missing":
        message = "missing required key"
    elif error["type"] == "union_tag_invalid":
        message = "type must be one of float, int, categorical"
    elif error["type"] == "union_tag_not_found":  # no `type`: a typo of it, most likely
        typo = _typo_of_type(error.get("input"))
        if typo is not None:
            key, message = f"{key}.{typo}", "unknown key (did you mean type?)"
        else:
            message = "missing required key type (float, int or categorical)"
    elif "input" in error and error["type"] not in {"value_error", "assertion_error"}:
        message = f"{message} (got {error['input']!r})"
    return f"{key}: {message}" if key else message


def _first_error(errors: list[Any]) -> Any:
    """The error to name: a NaN or infinity before the "not a string" its union's other
    members also report, and named without the union member (`choices.1`, not `.float`)."""
    for error in errors:
        if error["type"] == "finite_number":
            loc = error["loc"]
            trimmed = loc[:-1] if loc and loc[-1] in {"int", "float"} else loc
            return {**error, "loc": trimmed}
    return errors[0]


_SECTIONS: dict[str, type[BaseModel]] = {
    "study": StudySection,
    "trial": TrialSection,
    "tracking": TrackingSection,
}


_PARAMS: dict[str, type[BaseModel]] = {
    "float": FloatParam, "int": IntParam, "categorical": CategoricalParam,
}  # fmt: skip


def _typo_of_type(given: Any) -> str | None:
    """The key of a `[space.*]` table without `type` that looks like a typo of it."""
    keys = [str(key) for key in given] if isinstance(given, Mapping) else []
    return next((k for k in keys if difflib.get_close_matches(k, ["type"], cutoff=0.6)), None)


def _close_key(loc: tuple[int | str, ...]) -> str | None:
    """The known key of the same table that an unknown one looks like a typo of (a param's
    keys are short: `lwo` is 0.67 like `low`, so a lower bar there)."""
    cutoff = 0.75
    if len(loc) == 1:
        known: list[str] = ["study", "trial", "space", "enqueue", "tracking"]
    elif len(loc) == 2 and loc[0] in _SECTIONS:
        known = list(_SECTIONS[str(loc[0])].model_fields)
    elif len(loc) == 4 and loc[0] == "space" and loc[2] in _PARAMS:
        known, cutoff = list(_PARAMS[str(loc[2])].model_fields), 0.6
    else:
        return None
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=cutoff)
    return close[0] if close else None


def _without_union_tags(loc: tuple[int | str, ...]) -> list[int | str]:
    """Drop the discriminator names pydantic puts in the location of a tagged union."""
    tags = {"float", "int", "categorical"}
    return [
        part
        for index, part in enumerate(loc)
        if not (part in tags and index >= 2 and loc[0] == "space")
    ]
