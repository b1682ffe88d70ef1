"""A study's budgets, and which of them ends a run: pure, from what the run has spent.

Besides `n_trials`, a user budgets time, GPUs, a goal and failures (Optuna's
`optimize(timeout=...)`, Ray Tune's `time_budget_s`, Katib's `objective.goal` and
`maxFailedTrialCount`). The loop keeps a `Spent`, asks `reached` each pass, and once a budget
is reached sends no new trial. `usage` is what the summary, `--json` and `trialq status` show.

- `max_wall_s`: this run's wall time. Trials in flight finish; with `hard_wall`, they are
  stopped instead and left for a later run, which sends them again.
- `max_gpu_hours`: the study's finished trials' `duration_s` x `gpus`, summed from their
  own records, so a re-run goes on counting where the last one stopped.
- `goal`: the best value reached it (at or above when maximizing, at or below when
  minimizing); one objective only.
- `max_failed_trials`: the study's failed trials; the run stops as failing (exit 5), the
  rest of `n_trials` kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Budget:
    """What a run may spend; None: no such limit."""

    n_trials: int
    max_wall_s: float | None = None
    hard_wall: bool = False
    max_gpu_hours: float | None = None
    goal: float | None = None
    maximize: bool = True
    max_failed_trials: int | None = None


@dataclass(frozen=True)
class Spent:
    """What the study (and this run, for wall time) has spent so far."""

    finished: int = 0
    failed: int = 0
    wall_s: float = 0.0
    gpu_hours: float = 0.0
    best: float | None = None


@dataclass(frozen=True)
class Stop:
    """The budget that ended the run, and the line that says so."""

    budget: str
    line: str
    failing: bool = False
    """Whether the run stops as failing (exit 5) rather than as done."""


def reached(budget: Budget, spent: Spent) -> Stop | None:
    """The first budget reached, in the order a user would want to hear of it."""
    for check in (_failures, _goal, _gpu_hours, _wall):
        stop = check(budget, spent)
        if stop is not None:
            return stop
    return None


@dataclass(frozen=True)
class BudgetUse:
    """One budget's limit and how much of it is used (`used`: None, a goal not yet met by
    any value)."""

    limit: float | int
    used: float | int | None

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "used": self.used}


def usage(budget: Budget, spent: Spent) -> dict[str, BudgetUse]:
    """Each budget set: its limit and how much of it is used."""
    rows = {"n_trials": BudgetUse(budget.n_trials, spent.finished)}
    optional = {
        "max_wall_s": (budget.max_wall_s, round(spent.wall_s, 1)),
        "max_gpu_hours": (budget.max_gpu_hours, round(spent.gpu_hours, 4)),
        "goal": (budget.goal, spent.best),
        "max_failed_trials": (budget.max_failed_trials, spent.failed),
    }
    for name, (limit, used) in optional.items():
        if limit is not None:
            rows[name] = BudgetUse(limit, used)
    return rows


def _failures(budget: Budget, spent: Spent) -> Stop | None:
    limit = budget.max_failed_trials
    if limit is None or spent.failed < limit:
        return None
    line = (
        f"stopped: {spent.failed} trials failed (max_failed_trials = {limit}); "
        f"the rest of the budget is kept"
    )
    return Stop("max_failed_trials", line, failing=True)


def _goal(budget: Budget, spent: Spent) -> Stop | None:
    goal, best = budget.goal, spent.best
    if goal is None or best is None:
        return None
    if (best >= goal) if budget.maximize else (best <= goal):
        return Stop("goal", f"stopped: the best value {best:.6g} reached the goal {goal:g}")
    return None


def _gpu_hours(budget: Budget, spent: Spent) -> Stop | None:
    limit = budget.max_gpu_hours
    if limit is None or spent.gpu_hours < limit:
        return None
    line = f"stopped: {spent.gpu_hours:.3g} GPU-hours used (max_gpu_hours = {limit:g})"
    return Stop("max_gpu_hours", line)


def _wall(budget: Budget, spent: Spent) -> Stop | None:
    limit = budget.max_wall_s
    if limit is None or spent.wall_s < limit:
        return None
    then = "trials in flight stopped for a later run" if budget.hard_wall else "no new trial"
    return Stop("max_wall_s", f"stopped: max_wall_s = {limit:g} reached; {then}")
