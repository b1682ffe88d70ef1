"""TPE's history bounded past a size, and the index it reads (`trialq.driver.sampling.history`)."""

from __future__ import annotations

import math
import random

import optuna
import pytest
from optuna.distributions import FloatDistribution, IntDistribution
from optuna.samplers._tpe.sampler import _split_trials
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


def _two_objectives(trial: optuna.trial.FrozenTrial) -> list[float]:
    x, n = trial.params["x"], trial.params["n"]
    return [(x - 1) ** 2 + n, (x + 1) ** 2 + 8 - n]


def _dominated(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Whether `b` dominates `a` (both minimised)."""
    return all(y <= x for x, y in zip(a, b, strict=True)) and a != b


def _ranks(losses: dict[int, tuple[float, ...]]) -> dict[int, int]:
    """Each trial's non-dominated front, 0 first, by peeling fronts off one by one."""
    left, ranks, rank = dict(losses), {}, 0
    while left:
        front = [n for n, v in left.items() if not any(_dominated(v, w) for w in left.values())]
        for number in front:
            ranks[number] = rank
            del left[number]
        rank += 1
    return ranks


def test_with_several_objectives_the_index_keeps_the_first_whole_fronts() -> None:
    """The kept best hold the study's first non-dominated fronts, whole, at least `best`
    trials in them and a tenth of the finished ones (what TPE calls good), whatever order the
    trials came in; a trial dropped is dominated by one kept; and they are a bounded share of
    the study."""
    study = optuna.create_study(directions=["minimize", "maximize"])
    rng = random.Random(4)
    index = TrialIndex(study.directions, best=6, recent=0)
    for _ in range(120):
        trial = study.ask(SPACE)
        first, second = _two_objectives(trial)
        study.tell(trial, [first + rng.random(), -second])
        index.refresh(study)
    kept = index.kept()
    losses = {t.number: (t.values[0], -t.values[1]) for t in study.trials}
    ranks = _ranks(losses)
    first = sorted(ranks.values())[12 - 1]  # a tenth of the 120 finished: more than 6
    assert {n for n, rank in ranks.items() if rank <= first} <= {t.number for t in kept}
    assert len(kept) < 60, len(kept)
    dropped = set(losses) - {t.number for t in kept}
    for number in dropped:  # every dropped trial is dominated by one kept
        assert any(_dominated(losses[number], losses[t.number]) for t in kept)


def _asked_two(sampler: optuna.samplers.BaseSampler, n: int) -> list[dict]:
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    asked = []
    for _ in range(n):
        trial = study.ask(SPACE)
        asked.append(trial.params)
        study.tell(trial, _two_objectives(trial))
    return asked


def test_several_objectives_are_bounded_past_the_bound_and_exact_below_it() -> None:
    args = {"seed": 5, "n_startup_trials": 5}
    plain = _asked_two(optuna.samplers.TPESampler(**args), 40)
    bounded = _asked_two(BoundedTPE(**args, kept_best=5, kept_recent=10), 40)
    assert bounded[:16] == plain[:16], "the same until more than 15 trials finished"
    assert bounded != plain


def test_past_the_bound_several_objectives_call_the_same_trials_good() -> None:
    """TPE's split into good and bad trials, on what the bound shows it, puts the same
    trials in "good" as on the whole study: a tenth of every finished trial, by front."""
    study = optuna.create_study(
        directions=["minimize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=2)
    )
    for _ in range(150):
        trial = study.ask(SPACE)
        study.tell(trial, _two_objectives(trial))
    sampler = BoundedTPE(seed=0, kept_best=6, kept_recent=10)
    seen = sampler._seen(study)
    shown = seen._get_trials(deepcopy=False)
    assert len(shown) < 60
    whole = study.get_trials(deepcopy=False)
    good_whole, _ = _split_trials(study, whole, math.ceil(0.1 * len(whole)))
    good_shown, _ = _split_trials(seen, shown, sampler._gamma(len(shown)))
    assert sorted(t.number for t in good_shown) == sorted(t.number for t in good_whole)
