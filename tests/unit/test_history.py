"""TPE's history bounded past a size, and the index it reads (`trialq.driver.sampling.history`)."""

from __future__ import annotations

import random

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.trial import TrialState

from trialq.driver.sampling.history import BoundedTPE, TrialIndex

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {"x": FloatDistribution(-5, 5), "n": IntDistribution(1, 8)}


def _told(study: optuna.Study, rng: random.Random, n: int) -> None:
    for _ in range(n):
        trial = study.ask(SPACE)
        state = rng.choice((TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED))
        value = (trial.params["x"] - 1) ** 2 + trial.params["n"] if state.is_finished() else None
        study.tell(trial, value if state is TrialState.COMPLETE else None, state=state)


def _asked(sampler: optuna.samplers.BaseSampler, n: int, in_flight: int) -> list[dict]:
    """Params of `n` trials asked with `in_flight` running, on the same made-up objective."""
    study = optuna.create_study(sampler=sampler)
    rng, running, asked = random.Random(0), [], []
    while len(asked) < n:
        trial = study.ask(SPACE)
        asked.append(trial.params)
        running.append(trial)
        if len(running) >= in_flight:
            done = running.pop(rng.randrange(len(running)))
            study.tell(done, (done.params["x"] - 1) ** 2 + done.params["n"])
    return asked


def test_under_the_bound_tpe_proposes_exactly_what_optuna_does() -> None:
    args = {"seed": 3, "constant_liar": True, "n_startup_trials": 5}
    plain = _asked(optuna.samplers.TPESampler(**args), 60, in_flight=4)
    bounded = _asked(BoundedTPE(**args, kept_best=30, kept_recent=30), 60, in_flight=4)
    assert bounded == plain


def test_past_the_bound_tpe_proposes_from_the_kept_trials_only() -> None:
    args = {"seed": 3, "constant_liar": True, "n_startup_trials": 5}
    plain = _asked(optuna.samplers.TPESampler(**args), 40, in_flight=2)
    bounded = _asked(BoundedTPE(**args, kept_best=5, kept_recent=10), 40, in_flight=2)
    assert bounded[:16] == plain[:16], "the same until more than 15 trials finished"
    assert bounded != plain


def test_the_index_keeps_the_best_the_most_recent_and_the_running_trials() -> None:
    study = optuna.create_study(direction="maximize")
    rng = random.Random(1)
    index = TrialIndex(study.directions, best=4, recent=6)
    for _ in range(5):  # refreshed now and then, as asks come, trials told in between
        _told(study, rng, 17)
        running = [study.ask(SPACE) for _ in range(rng.randint(0, 3))]
        index.refresh(study)
        trials = study.get_trials(deepcopy=False)
        learnt = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        complete = [t for t in learnt if t.state is TrialState.COMPLETE]
        best = sorted(complete, key=lambda t: (-t.value, -t.number))[:4]
        expected = {t.number for t in best} | {t.number for t in learnt[-6:]}
        expected |= {t.number for t in trials if t.state is TrialState.RUNNING}
        assert [t.number for t in index.kept()] == sorted(expected)
        assert index.learnt == len(learnt)
        assert [t.number for t in index.running()] == [t.number for t in running]
        for trial in running:
            study.tell(trial, 0.0)


def test_an_index_refuses_a_storage_not_in_number_order() -> None:
    study = optuna.create_study()
    _told(study, random.Random(0), 3)
    trials = study.get_trials(deepcopy=False)
    study._storage.get_all_trials = lambda *a, **k: list(reversed(trials))  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="number order"):
        TrialIndex(study.directions, 1, 1).refresh(study)
