"""A study's trials as flat rows: the facts `trialq status` and `trialq report` both show.

One place reads the user attrs the driver writes (docs/design.md, "What every finished trial
records") and decides what a trial's value, peak memory or error headline is, so the
terminal table and the report's table never disagree.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import optuna

from trialq.oom_stand_ins import real_values
from trialq.wire.failures import headline
from trialq.wire.heartbeat import RunningTrial
from trialq.wire.outcome import Outcome
from trialq.wire.record import TrialRecord


@dataclass(frozen=True)
class TrialRow:
    """One trial as shown: Optuna's facts of it, and its record whole (what it measured,
    how it ended; a field is None where the trial has not said yet)."""

    number: int
    state: str
    values: tuple[float, ...] | None
    params: dict[str, Any]
    record: TrialRecord

    @property
    def outcome(self) -> str | None:
        """The outcome its record names, once it has ended."""
        return self.record.outcome

    @property
    def error(self) -> str | None:
        """The first line of its error: what a table has room for."""
        return headline(self.record.error)

    @property
    def label(self) -> str:
        """The outcome of a finished trial, else its state: `ok`, `pruned`, `running`..."""
        return self.outcome or self.state.lower()

    @property
    def failed(self) -> bool:
        """Ended as a failure: neither ok nor pruned, nor still running or waiting."""
        if self.label in ("running", "waiting"):
            return False
        outcome = Outcome.read(self.label)
        return outcome is None or not outcome.succeeded


def trial_rows(study: optuna.Study) -> list[TrialRow]:
    """Every trial of the study, in number order."""
    return [_row(trial) for trial in study.get_trials(deepcopy=False)]


def _row(trial: optuna.trial.FrozenTrial) -> TrialRow:
    return TrialRow(
        number=trial.number,
        state=trial.state.name,
        values=tuple(values) if (values := real_values(trial)) else None,
        params=dict(trial.params),
        record=TrialRecord.read(trial.user_attrs),
    )


def with_running(rows: list[TrialRow], study: str, running: list[RunningTrial]) -> list[TrialRow]:
    """RUNNING rows gain the worker that runs them and how long it has, from its beacon."""
    by_number = {r.number: r for r in running if r.study == study}
    return [_running_row(row, by_number.get(row.number)) for row in rows]


def _running_row(row: TrialRow, running: RunningTrial | None) -> TrialRow:
    if running is None or row.state != "RUNNING":
        return row
    since = round(time.time() - running.started_at, 2)
    update = {"worker_host": running.worker, "attempts": running.attempt, "duration_s": since}
    return replace(row, record=row.record.model_copy(update=update))


def outcome_counts(rows: list[TrialRow]) -> dict[str, int]:
    """How many trials ended each way (and how many are still running or waiting)."""
    return dict(sorted(Counter(row.label for row in rows).items()))


def outcome_text(rows: list[TrialRow], empty: str) -> str:
    """`ok 5, oom 1, pruned 2`, or `empty` for no trials."""
    return ", ".join(f"{k} {v}" for k, v in outcome_counts(rows).items()) or empty


def best_line(study: optuna.Study) -> str:
    """The best trial (or the Pareto front's trials, for several objectives)."""
    try:
        if len(study.directions) > 1:
            front = sorted(t.number for t in study.best_trials)
            return "Pareto front: " + (", ".join(f"#{n}" for n in front) or "none yet")
        best = study.best_trial
    except ValueError:
        return "best trial: none complete yet"
    return f"best trial: #{best.number} value {best.value:.6g} params {best.params}"


def human_bytes(n_bytes: int | None) -> str:
    """`512 MiB`, `1.5 GiB`; `-` for no reading."""
    if n_bytes is None:
        return "-"
    if n_bytes >= 2**30:
        return f"{n_bytes / 2**30:.1f} GiB"
    return f"{n_bytes / 2**20:.0f} MiB"


def value_text(values: tuple[float, ...] | None) -> str:
    """A trial's objective value(s), five significant digits."""
    return "-" if not values else ", ".join(f"{v:.5g}" for v in values)
