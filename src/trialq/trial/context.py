"""`TrialContext`: what a trial's own code sees of trialq while it runs."""

from __future__ import annotations

import contextlib
import json
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from trialq.trial import batch_size
from trialq.trial.driver_questions import Questions
from trialq.trial.metric_value import NotOneNumber, one_number
from trialq.wire.channel import TrialAddress, report_refusal
from trialq.wire.messages import ArtifactMeta
from trialq.wire.record import TrialRecord
from trialq.wire.suggest import (
    Distribution,
    categorical_distribution,
    float_distribution,
    int_distribution,
)

_log = logging.getLogger("trialq.reports")


def _as_step(step: object) -> object:
    """An integer of any kind (numpy's, torch's) as a Python int; anything else as it is."""
    try:
        return operator.index(step)  # type: ignore[arg-type]
    except TypeError:
        return step


class Reports(Protocol):
    """Where a trial's reports go and its flags come from: a `ReportSender` in a worker's
    trial process (never waits on Redis), a `ReportChannel`, or a test's stand-in."""

    def report(self, address: TrialAddress, step: int, value: float) -> None: ...

    def prune_requested(self, address: TrialAddress) -> bool: ...

    def stop_requested(self, address: TrialAddress) -> bool: ...


class TrialContext:
    """The running trial: its number, params and attempt, and the way to report and prune."""

    def __init__(
        self,
        address: TrialAddress,
        params: Mapping[str, Any],
        channel: Reports | None,
        checkpoint_dir: Path | None = None,
        artifact_saver: Callable[[Path], ArtifactMeta] | None = None,
        checkpoint_sync: Callable[[], None] | None = None,
        mlflow_run: Callable[[], str | None] | None = None,
        questions: Questions | None = None,
        distributions: Mapping[str, Distribution] | None = None,
    ) -> None:
        self._address = address
        self._params = dict(params)
        self._questions = questions
        """Who answers `suggest_*` for a name not carried, and `should_prune()`'s verdict."""
        self._distributions = dict(distributions or {})
        """The distribution each carried param was drawn from (Optuna's JSON)."""
        self._last_report: tuple[int, float] | None = None
        self._verdict: tuple[int, bool] | None = None
        """The driver's verdict on the last step it judged, and that step."""
        self._channel = channel
        self._checkpoint_dir = checkpoint_dir
        self._artifact_saver = artifact_saver
        self._checkpoint_sync = checkpoint_sync
        self._mlflow_run = mlflow_run
        self._mlflow_run_id: str | None = None
        self.last_step: int | None = None
        self.reports_refused = 0
        """Reports the storage could not hold (a NaN, a step past 32 bits): dropped, the
        first said in the trial's log, all counted in its `reports_dropped`."""
        self.stop_seen = False
        """Whether `should_stop()` said yes to the trial: its return is then an attempt cut
        short (`preempted`), not a final value."""
        self.artifacts: list[ArtifactMeta] = []
        """The meta of every file `save_artifact` stored, for the driver to link."""
        self.fitted_batch_size: int | None = None
        """What `fit_batch_size` answered last (None: not called); the runner puts it on the
        result, and the driver records it as the user attr `fitted_batch_size`."""
        self._user_attrs: dict[str, Any] = {}

    @property
    def number(self) -> int:
        """The Optuna trial number (the same on every attempt)."""
        return self._address.number

    @property
    def attempt(self) -> int:
        """1 on the first run, 2 after the first lost worker, and so on."""
        return self._address.attempt

    @property
    def checkpoint_dir(self) -> Path:
        """This trial's folder for checkpoints: the same on every attempt, empty on the
        first; what an attempt wrote there is there for the next (docs/preemption.md)."""
        if self._checkpoint_dir is None:
            raise RuntimeError("this trial has no checkpoint_dir (not run by a trialq worker)")
        self._checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return self._checkpoint_dir

    @property
    def mlflow_run_id(self) -> str | None:
        """This trial's nested MLflow run, for `mlflow.start_run(run_id=...)`: the one the
        driver fills with the trial's params and metrics when it tells it, the same on every
        attempt. None where the study does not track with MLflow, or MLflow failed here (said
        in the trial's log). Looked up on first use, which also points MLflow's fluent API at
        the study's tracking URI (docs/tracking.md)."""
        if self._mlflow_run is not None:
            self._mlflow_run_id = self._mlflow_run()
            self._mlflow_run = None  # once: a failure is said once, not on every use
        return self._mlflow_run_id

    @property
    def params(self) -> dict[str, Any]:
        """The parameter set the driver sampled (a copy)."""
        return dict(self._params)

    def report(self, value: float, step: int) -> None:
        """Send an intermediate objective value to the driver's pruner. One the storage
        cannot hold (`wire.channel.report_refusal`: a NaN or infinite value, a step that is
        no integer from 0 to 2**31 - 1) is dropped and counted, the first said in the log;
        the trial goes on."""
        index = _as_step(step)
        refusal, number = _report_value(value)
        refusal = refusal or report_refusal(index, number)
        if refusal is not None or not isinstance(index, int) or not isinstance(number, float):
            self.reports_refused += 1
            if self.reports_refused == 1:
                _log.warning("report refused and dropped: %s (reports_dropped counts it)", refusal)
            return
        self.last_step = index
        self._last_report = (index, number)
        if self._channel is not None:
            self._channel.report(self._address, index, number)

    def should_prune(self) -> bool:
        """Whether the driver's pruner says this trial should stop; raise `TrialPruned` (or
        `optuna.TrialPruned`) if so. As Optuna's: the verdict on the step just reported,
        waited for (bounded: `driver_questions.JUDGE_WAIT_S`); where none came, or no driver
        answers, the prune flag the driver raised."""
        report = self._last_report
        if self._questions is not None and report is not None:
            if self._verdict is None or self._verdict[0] != report[0]:
                verdict = self._questions.judge(*report)
                if verdict is not None:
                    self._verdict = (report[0], verdict)
            if self._verdict is not None and self._verdict[0] == report[0]:
                return self._verdict[1]  # the pruner's word on the last step: no flag to read
        return self._channel is not None and self._channel.prune_requested(self._address)

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        """A float param, as `optuna.Trial.suggest_float`: the value the task carried, else
        the driver's sampler's (one round trip), recorded on the study's trial."""
        return float(self._suggest(name, float_distribution(low, high, step, log)))

    def suggest_int(
        self, name: str, low: int, high: int, *, step: int = 1, log: bool = False
    ) -> int:
        """An int param, as `optuna.Trial.suggest_int` (see `suggest_float`)."""
        return int(self._suggest(name, int_distribution(low, high, step, log)))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        """One of `choices`, as `optuna.Trial.suggest_categorical` (see `suggest_float`)."""
        return self._suggest(name, categorical_distribution(choices))

    def _suggest(self, name: str, distribution: Distribution) -> Any:
        """A param already here with the same distribution is returned as it is; any other
        is the driver's to answer (Optuna's own checks, and its error, included)."""
        if name in self._params and self._distributions.get(name) == distribution:
            return self._params[name]
        if self._questions is None:
            raise RuntimeError(
                f"suggest {name!r}: no driver answers this trial (its params are "
                f"{sorted(self._params)})"
            )
        value = self._questions.suggest(name, distribution)
        self._params[name], self._distributions[name] = value, distribution
        return value

    @property
    def user_attrs(self) -> dict[str, Any]:
        """What this attempt set with `set_user_attr` (a copy)."""
        return dict(self._user_attrs)

    def set_user_attr(self, key: str, value: Any) -> None:
        """As `optuna.Trial.set_user_attr`: stored on the study's trial under `key` when the
        trial is told (whatever its outcome). The value must be JSON, as Optuna's storages
        keep it; trialq's own names (`TrialRecord`'s: `outcome`, `metrics`, ...) are refused,
        as they would overwrite what trialq records."""
        if not isinstance(key, str):
            raise TypeError(f"set_user_attr: the key must be a str, not {type(key).__name__}")
        if key in TrialRecord.model_fields:
            raise ValueError(
                f"set_user_attr: {key!r} is a user attr trialq records itself; choose another name"
            )
        try:
            json.dumps(value, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"set_user_attr {key!r}: the value is not JSON ({exc})") from None
        self._user_attrs[key] = value

    def suggest_uniform(self, name: str, low: float, high: float) -> float:
        """Optuna's older name for `suggest_float(name, low, high)`."""
        return self.suggest_float(name, low, high)

    def suggest_loguniform(self, name: str, low: float, high: float) -> float:
        """Optuna's older name for `suggest_float(name, low, high, log=True)`."""
        return self.suggest_float(name, low, high, log=True)

    def suggest_discrete_uniform(self, name: str, low: float, high: float, q: float) -> float:
        """Optuna's older name for `suggest_float(name, low, high, step=q)`."""
        return self.suggest_float(name, low, high, step=q)

    def should_stop(self) -> bool:
        """Whether this attempt was told to stop: its worker got SIGTERM (a spot node being
        reclaimed) or someone asked it to end early. Save to `checkpoint_dir` and return:
        the attempt ends `preempted` and the trial is re-sent, to resume from what it saved.
        Under an object-store root, each yes first puts `checkpoint_dir` into the store.
        """
        if not self.stop_seen:
            self.stop_seen = self._channel is not None and self._channel.stop_requested(
                self._address
            )
        if self.stop_seen and self._checkpoint_sync is not None:
            self._checkpoint_sync()
        return self.stop_seen

    def save_artifact(self, path: str | Path) -> str:
        """Store a file in the study's Optuna artifact store and link it to this trial (the
        driver writes the link, as `optuna.artifacts.upload_artifact` would); its artifact id.
        """
        if self._artifact_saver is None:
            raise RuntimeError("this trial has no artifact store (not run by a trialq worker)")
        meta = self._artifact_saver(Path(path))
        self.artifacts.append(meta)
        return meta.artifact_id

    def fit_batch_size(
        self,
        try_batch: Callable[[int], object],
        *,
        start: int = 32,
        max: int = 4096,
        max_tries: int = batch_size.MAX_TRIES,
        margin: float = 0.0,
    ) -> int:
        """The largest batch size (up to `max`) whose `try_batch(size)` does not run out of
        the trial's GPU memory: doubled from `start` until one does, then bisected; less
        `margin`, a fraction kept free. Recorded on the trial as the user attr
        `fitted_batch_size`, whatever its outcome; not even 1 fitting ends the trial `oom`.
        PyTorch and JAX (docs/frameworks/pytorch.md); not Keras (docs/frameworks/keras.md).
        """
        size = batch_size.fit(
            try_batch, start=start, maximum=max, max_tries=max_tries, margin=margin
        )
        self.fitted_batch_size = size
        return size


def _report_value(value: object) -> tuple[str | None, object]:
    """A reported value as a float when it is one number (a 0-d tensor or NumPy scalar
    too, `metric_value.one_number`), or why not."""
    try:
        number = one_number(value)
    except NotOneNumber as exc:
        return f"value: {exc}", value
    if number is None and not isinstance(value, bool):
        with contextlib.suppress(TypeError, ValueError):
            number = float(value)  # type: ignore[arg-type]  # as before: text, Decimal
    return None, value if number is None else number
