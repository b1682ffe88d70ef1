"""A finished trial's objective values, picked out of the metrics it returned.

Pure: the loop hands an `ok` result in and tells what comes out. A metric the spec names
that is missing fails the trial (`error`); a non-finite objective fails it as `not_finite`
(Optuna's rule for a NaN objective), and the study goes on; a spec that cannot say which
metric is the objective stops the run (`SpecError`), since every trial would fail the same.
"""

from __future__ import annotations

import math

from trialq.errors import SpecError
from trialq.wire.messages import Outcome, TrialResult


def objective_of(
    result: TrialResult, names: tuple[str, ...] | None
) -> tuple[TrialResult, list[float] | None]:
    """The objective values of an ok result, or the result turned into a failure."""
    if result.outcome is not Outcome.OK:
        return result, None
    try:
        values = objective_values(result.metrics, names)
    except KeyError as exc:
        return result.failed_as(Outcome.ERROR, str(exc.args[0])), None
    labels = names if names and len(names) == len(values) else tuple(result.metrics)
    bad = [
        f"{label} = {v}" for label, v in zip(labels, values, strict=True) if not math.isfinite(v)
    ]
    if bad:
        error = f"objective is not finite: {', '.join(bad)}"
        return result.failed_as(Outcome.NOT_FINITE, error), None
    return result, values


def objective_values(metrics: dict[str, float], names: tuple[str, ...] | None) -> list[float]:
    """Pick the objectives out of a trial's metrics (raise KeyError naming what is missing)."""
    if set(metrics) == {"value"} and (names is None or len(names) == 1):
        return [metrics["value"]]  # the trial returned a bare number
    if names is None:
        if len(metrics) == 1:
            return list(metrics.values())
        raise SpecError(
            f"the trial returned several metrics ({', '.join(sorted(metrics))}) "
            "but the spec names none: set study.metric"
        )
    missing = [name for name in names if name not in metrics]
    if missing:
        raise KeyError(
            f"metric {', '.join(missing)} not returned (got {', '.join(sorted(metrics))})"
        )
    return [metrics[name] for name in names]
