"""The best so far kept as trials are told (`trialq.driver.best`) answers as Optuna's own
`study.best_value` and `best_trials` do on the same trials."""

from __future__ import annotations

import random

import optuna
import pytest
from optuna.study import StudyDirection
from optuna.trial import TrialState

from trialq.driver.best import BestSoFar

optuna.logging.set_verbosity(optuna.logging.WARNING)

STATES = (TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def _random_trials(study: optuna.Study, seed: int, n: int, constrained: bool) -> None:
    """Trials of every finished state, values drawn from few levels (so ties happen), some
    infeasible."""
    rng = random.Random(seed)
    k = len(study.directions)
    for _ in range(n):
        state = rng.choice(STATES)
        values = [float(rng.randint(0, 4)) for _ in range(k)] if state.is_finished() else None
        attrs = {}
        if constrained:
            attrs["constraints"] = (rng.choice((0.0, -1.0, 1.0)),)
        if state is not TrialState.COMPLETE:
            values = None
        study.add_trial(optuna.create_trial(state=state, values=values, system_attrs=attrs))


def _kept(study: optuna.Study) -> BestSoFar:
    best = BestSoFar(study.directions)
    for trial in study.get_trials(deepcopy=False):
        best.add_frozen(trial)
    return best


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
@pytest.mark.parametrize("constrained", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_one_objective_as_optuna(direction: str, constrained: bool, seed: int) -> None:
    study = optuna.create_study(direction=direction)
    _random_trials(study, seed, 40, constrained)
    best = _kept(study)
    try:
        expected = study.best_value
    except ValueError:  # no feasible trial completed
        expected = None
    assert best.value == expected
    assert best.numbers == sorted(t.number for t in study.best_trials), "ties kept"


@pytest.mark.parametrize("directions", [["minimize", "maximize"], ["maximize"] * 3])
@pytest.mark.parametrize("constrained", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_several_objectives_are_the_pareto_front(
    directions: list[str], constrained: bool, seed: int
) -> None:
    study = optuna.create_study(directions=directions)
    _random_trials(study, seed, 60, constrained)
    best = _kept(study)
    assert best.value is None, "no single best value with several objectives"
    assert best.numbers == sorted(t.number for t in study.best_trials)


def test_failed_pruned_and_infeasible_trials_are_never_best() -> None:
    best = BestSoFar([StudyDirection.MINIMIZE])
    best.add(0, TrialState.FAIL, [-10.0], feasible=True)
    best.add(1, TrialState.PRUNED, [-10.0], feasible=True)
    best.add(2, TrialState.COMPLETE, [-10.0], feasible=False)
    assert best.value is None and best.numbers == []
    best.add(3, TrialState.COMPLETE, [5.0], feasible=True)
    best.add(4, TrialState.COMPLETE, [5.0], feasible=True)
    best.add(5, TrialState.COMPLETE, [7.0], feasible=True)
    assert best.value == 5.0 and best.numbers == [3, 4]
    best.add(6, TrialState.COMPLETE, [4.0], feasible=True)
    assert best.value == 4.0 and best.numbers == [6]


def test_maximize_keeps_the_highest() -> None:
    best = BestSoFar([StudyDirection.MAXIMIZE])
    for number, value in enumerate([1.0, 3.0, 2.0]):
        best.add(number, TrialState.COMPLETE, [value], feasible=True)
    assert best.value == 3.0 and best.numbers == [1]
