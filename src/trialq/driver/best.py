"""The study's best so far, kept as trials are told: no pass of the loop reads every trial.

Optuna's `study.best_value` and `best_trials` read every finished trial of the study each
time they are asked; the loop asked on every pass (the progress line, the `goal` budget), so
a pass cost more the larger the study grew (28 % of the driver's time at 10,000
trials). `BestSoFar` reads the study's finished trials once, when a run opens, and then
takes each trial as it is told. It answers as Optuna does (tests/unit/test_best.py holds it
to Optuna's own answer on the same trials): only COMPLETE trials count, an infeasible one (a
constraint above 0, trialq's `oom` one) never, and with several objectives the best trials
are the Pareto front, ties kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState


@dataclass(frozen=True)
class Scored:
    """One trial on the front: its number and its values as losses (lower is better)."""

    number: int
    losses: tuple[float, ...]


class BestSoFar:
    """The best trials of a study, kept as trials finish."""

    def __init__(self, directions: Sequence[StudyDirection]) -> None:
        self._signs = tuple(-1.0 if d is StudyDirection.MAXIMIZE else 1.0 for d in directions)
        self._front: list[Scored] = []

    def add(
        self, number: int, state: TrialState, values: Sequence[float] | None, feasible: bool
    ) -> None:
        """A trial finished as `state` with `values`: only a feasible COMPLETE one may be best."""
        if state is not TrialState.COMPLETE or values is None or not feasible:
            return
        if len(values) != len(self._signs):
            return  # Optuna would refuse the study's best on it; it never counts here
        new = Scored(number, tuple(s * float(v) for s, v in zip(self._signs, values, strict=True)))
        if any(_dominates(kept.losses, new.losses) for kept in self._front):
            return
        self._front = [kept for kept in self._front if not _dominates(new.losses, kept.losses)]
        self._front.append(new)

    def add_frozen(self, trial: FrozenTrial) -> None:
        """A trial read from the storage (an earlier run's, or one finished from outside)."""
        feasible = all(c <= 0.0 for c in trial.constraints.values())
        self.add(trial.number, trial.state, trial.values, feasible)

    @property
    def value(self) -> float | None:
        """The best value of a single-objective study; None before one trial completed."""
        if len(self._signs) != 1 or not self._front:
            return None
        return self._signs[0] * self._front[0].losses[0]

    @property
    def numbers(self) -> list[int]:
        """The numbers of the best trials (Optuna's `best_trials`), in number order."""
        return sorted(kept.number for kept in self._front)


def _dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """`a` is no worse than `b` in every objective and better in one (equal values: no)."""
    pairs = list(zip(a, b, strict=True))
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)
