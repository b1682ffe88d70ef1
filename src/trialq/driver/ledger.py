"""The run's books: trials finished by state, GPU-hours used, wall time, the best value so
far, and the budgets they are held against (`trialq.driver.budget`, which decides; this
keeps the figures). The study's trials are read once, when a run opens; after that every
figure is kept as trials are told, so a pass costs the same at the 10,000th trial as at the
first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from trialq.driver import budget as budgets
from trialq.driver.best import BestSoFar
from trialq.driver.budget import Budget, BudgetUse, Spent, Stop
from trialq.driver.progress import Counts
from trialq.oom_stand_ins import counted_state
from trialq.spec import StudySpec
from trialq.wire.record import TrialRecord

FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


@dataclass(frozen=True)
class LastRun:
    """How a run ended: what stopped it and each budget's use. Kept on the study as the user
    attr `LAST_RUN_ATTR` (`trialq status`), and part of the run's summary."""

    stopped_by: str
    budgets: dict[str, BudgetUse]

    def to_json(self) -> dict[str, Any]:
        """As the study attr and `submit-study --json` hold it."""
        use = {name: row.to_json() for name, row in self.budgets.items()}
        return {"stopped_by": self.stopped_by, "budgets": use}


class Ledger:
    """What the study has finished and spent, and the budget that ended the run, if one
    has."""

    def __init__(
        self,
        study: optuna.Study,
        clock: Callable[[], float],
        budget: Budget,
    ) -> None:
        self._study, self._clock = study, clock
        self.budget = budget
        """What the run may spend: `n_trials` finished trials, and the rest that is set."""
        self.stop: Stop | None = None
        """The budget that ended the run, once one has."""
        self.counts = Counts()
        self.best = BestSoFar(study.directions)
        """The study's best trials, kept as they are told (`trialq.driver.best`)."""
        self.gpu_hours = 0.0
        self._started = clock()

    @property
    def n_trials(self) -> int:
        """The finished trials the run is to reach: its budget's alone."""
        return self.budget.n_trials

    def open(self) -> None:
        """Start the run's books: its clock, and what the study finished in earlier runs."""
        self._started = self._clock()
        for frozen in self._study.get_trials(deepcopy=False, states=FINISHED_STATES):
            self.counts.record(counted_state(frozen))
            self.best.add_frozen(frozen)
            self.gpu_hours += TrialRecord.read(frozen.user_attrs).gpu_hours

    def record(self, state: TrialState, record: TrialRecord | None = None) -> None:
        """One more finished trial, and the GPU-hours its record says it used."""
        self.counts.record(state)
        if record is not None:
            self.gpu_hours += record.gpu_hours

    def told(
        self, number: int, state: TrialState, values: Sequence[float] | None, feasible: bool
    ) -> None:
        """What Optuna was told of a trial (`state`, `values`): it may be the best so far."""
        self.best.add(number, state, values, feasible)

    def finished_elsewhere(self, trial: FrozenTrial) -> None:
        """A trial someone else finished: as the storage holds it, it may be the best."""
        self.best.add_frozen(trial)

    def reached(self) -> Stop | None:
        """The budget the run just reached, once: None before, and after it is known."""
        if self.stop is not None:
            return None
        self.stop = budgets.reached(self.budget, self.spent())
        return self.stop

    def spent(self) -> Spent:
        return Spent(
            finished=self.counts.finished,
            failed=self.counts.failed,
            wall_s=self._clock() - self._started,
            gpu_hours=self.gpu_hours,
            best=self.best_value(),
        )

    def usage(self) -> dict[str, BudgetUse]:
        """Each budget set, its limit and what is used (the summary's `budgets`)."""
        return budgets.usage(self.budget, self.spent())

    def last_run(self, ended_by: str | None = None) -> LastRun:
        """What ended the run (`ended_by` where it was no budget: an interrupt, failures in
        a row) and how much of each budget is used (`trialq status`)."""
        stopped_by = ended_by or (self.stop.budget if self.stop is not None else "n_trials")
        return LastRun(stopped_by, self.usage())

    def best_value(self) -> float | None:
        """The best objective value so far; None with several objectives or none complete."""
        return self.best.value


def budget_for(spec: StudySpec, n_trials: int) -> Budget:
    """The spec's budgets, with `n_trials` (the spec's, or the command line's)."""
    study = spec.study
    return Budget(
        n_trials=n_trials,
        max_wall_s=study.max_wall_s,
        hard_wall=study.max_wall_hard,
        max_gpu_hours=study.max_gpu_hours,
        goal=study.goal,
        maximize=study.objective_directions[0] == "maximize",
        max_failed_trials=study.max_failed_trials,
    )
