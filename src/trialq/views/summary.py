"""The end-of-run summary of a study, as printed by `submit-study --json`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from trialq.oom_stand_ins import counted_state, real_values
from trialq.wire.failures import failure_line
from trialq.wire.record import TrialRecord


@dataclass(frozen=True)
class StudySummary:
    """Counts, the best trial and every trial with its state, values, params and attrs."""

    study: str
    n_complete: int
    n_pruned: int
    n_failed: int
    best_value: float | list[list[float]] | None
    """The best value; with several objectives, the Pareto front's values."""
    best_params: dict[str, Any] | None
    trials: list[optuna.trial.FrozenTrial]

    def to_json(self) -> dict[str, Any]:
        """As `submit-study --json` prints it (and `trialq status --json` extends it)."""
        return {
            "study": self.study,
            "n_complete": self.n_complete,
            "n_pruned": self.n_pruned,
            "n_failed": self.n_failed,
            "best_value": self.best_value,
            "best_params": self.best_params,
            "trials": [
                {
                    "number": t.number,
                    "state": t.state.name,
                    "values": real_values(t),
                    "params": t.params,
                    "user_attrs": t.user_attrs,
                }
                for t in self.trials
            ],
        }


def study_summary(study: optuna.Study) -> StudySummary:
    """Counts, the best trial and every trial of `study`."""
    trials = study.get_trials(deepcopy=False)
    counted = [counted_state(t) for t in trials]
    complete = [t for t, state in zip(trials, counted, strict=True) if state is TrialState.COMPLETE]
    best_value, best_params = _best(study, complete)
    return StudySummary(
        study=study.study_name,
        n_complete=len(complete),
        n_pruned=counted.count(TrialState.PRUNED),
        n_failed=counted.count(TrialState.FAIL),
        best_value=best_value,
        best_params=best_params,
        trials=trials,
    )


def failure_lines(summary: dict[str, Any]) -> list[str]:
    """`#0 error: ZeroDivisionError: float division by zero`, one line per failed trial."""
    lines = []
    for trial in summary["trials"]:
        record = TrialRecord.read(trial["user_attrs"])
        known = record.known_outcome
        if trial["state"] == "FAIL" or (known is not None and known.teaches_a_constraint):
            lines.append(failure_line(trial["number"], record.outcome, record.error))
    return lines


def rounded(value: Any) -> Any:
    """Floats to 6 significant digits (0.975, not 0.9750000238418579), in lists and dicts."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def _best(
    study: optuna.Study, complete: list[optuna.trial.FrozenTrial]
) -> tuple[Any, dict[str, Any] | None]:
    """Best value and params; for several objectives, the Pareto front's values."""
    if not complete:
        return None, None
    if len(study.directions) > 1:
        front = study.best_trials
        return [t.values for t in front], front[0].params if front else None
    best = study.best_trial
    return best.value, best.params
