"""Which sampler a spec names (`auto`: TPE), and how an out-of-memory trial is told to the GP
sampler a spec may name."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.samplers import TPESampler
from optuna.trial import TrialState

from trialq.driver.sampling.distinct import DistinctFromRunning
from trialq.driver.sampling.oom_constraint import oom_telling, penalty, sampler_kind
from trialq.driver.sampling.rule import chosen_sampler
from trialq.driver.sampling.taking_turns import TakingTurns
from trialq.driver.study import make_sampler
from trialq.errors import SpecError
from trialq.spec import StudySpec

SPACE = {
    "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
    "act": {"type": "categorical", "choices": ["relu", "tanh"]},
}


TWO_FLOATS = {
    "lr": {"type": "float", "low": 1e-4, "high": 1.0, "log": True},
    "momentum": {"type": "float", "low": 0.0, "high": 0.99},
}


def spec(
    max_in_flight: int | None, n_trials: int, space: dict[str, Any] | None = None, **study: Any
) -> StudySpec:
    space = {} if "search_space" in study else (SPACE if space is None else space)
    return StudySpec.model_validate(
        {
            "path": Path("spec.toml"),
            "study": {"name": "s", "n_trials": n_trials, "max_in_flight": max_in_flight, **study},
            "trial": {"entrypoint": "mod:train"},
            "space": space,
        }
    )


@pytest.mark.parametrize(
    ("max_in_flight", "n_trials", "fields", "expected"),
    [
        # `auto` is TPE whatever the study: no rule by budget, flight, space or objectives.
        (16, 50, {}, "tpe"),
        (16, 50, {"space": TWO_FLOATS}, "tpe"),
        (4, 99, {}, "tpe"),
        (None, 50, {}, "tpe"),
        (1, 50, {}, "tpe"),
        (16, 100, {}, "tpe"),
        (16, 50, {"directions": ["minimize", "minimize"], "metrics": ["a", "b"]}, "tpe"),
        (16, 50, {"search_space": "mod:space"}, "tpe"),
        # A named sampler is that sampler.
        (16, 50, {"sampler": "tpe"}, "tpe"),
        (1, 500, {"sampler": "gp"}, "gp"),
        (1, 500, {"sampler": "gp+tpe"}, "gp+tpe"),
        (16, 50, {"sampler": "random"}, "random"),
    ],
)  # fmt: skip
def test_auto_is_tpe_and_a_named_sampler_is_that_sampler(
    max_in_flight: int | None, n_trials: int, fields: dict[str, Any], expected: str
) -> None:
    assert chosen_sampler(spec(max_in_flight, n_trials, **fields)) == expected


def test_gp_and_tpe_named_is_built_behind_the_distinct_draws() -> None:
    pytest.importorskip("torch")
    built = make_sampler(spec(16, 50, sampler="gp+tpe", sampler_args={"seed": 1}))
    assert isinstance(built, DistinctFromRunning)
    assert isinstance(built.sampler, TakingTurns)
    gp, tpe = built.sampler.members
    assert isinstance(gp, optuna.samplers.GPSampler) and isinstance(tpe, TPESampler)
    assert not tpe._multivariate and not tpe._constant_liar  # Optuna 4's: a model a parameter
    assert sampler_kind(built) == "gp"  # an OOM trial is told as GP needs it
    auto = make_sampler(spec(16, 50))
    assert isinstance(auto, DistinctFromRunning)
    assert isinstance(auto.sampler, optuna.samplers.TPESampler)
    assert sampler_kind(auto) == "tpe"


def test_gp_without_torch_is_refused_and_auto_builds_tpe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch is installed here, so this fakes its absence (the lookup alone, named as a
    fake): the refusal names the sampler and the fix."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(SpecError, match=r"study.sampler: 'gp' needs torch.*pip install torch"):
        make_sampler(spec(16, 50, sampler="gp"))
    with pytest.raises(SpecError, match=r"study.sampler: 'gp\+tpe' needs torch"):
        make_sampler(spec(16, 50, sampler="gp+tpe"))
    auto = make_sampler(spec(16, 50))
    assert isinstance(auto, DistinctFromRunning), "auto falls back to TPE, wrapped"
    assert isinstance(auto.sampler, optuna.samplers.TPESampler)


def test_gp_is_told_an_oom_trial_as_a_penalty_worse_than_every_real_value() -> None:
    assert oom_telling("gp", ["minimize"]) == oom_telling("gp", ["minimize"], [])
    first = oom_telling("gp", ["minimize"])
    assert first is not None and first.state is TrialState.PRUNED and not first.constrained
    told = oom_telling("gp", ["minimize"], [(0.5,), (2.5,)])
    assert told is not None and told.state is TrialState.COMPLETE and not told.constrained
    assert told.values == [pytest.approx(2.7)]
    assert penalty([(0.5,), (2.5,)], ["maximize"]) == [pytest.approx(0.3)]
    assert penalty([(4.0,)], ["minimize"]) == [pytest.approx(4.4)]
    assert penalty([(0.0,)], ["maximize"]) == [-1.0]
    tpe = oom_telling("tpe", ["minimize"])
    assert tpe is not None and tpe.state is TrialState.PRUNED and tpe.constrained


def _oom_share(told_as_penalty: bool, seed: int) -> float:
    """A GP study on a square where width x depth above 0.3 does not fit (the bigger the
    better where it fits): the share of OOM trials among trials 15-29."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    sampler = optuna.samplers.GPSampler(seed=seed, n_startup_trials=8)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    space = {
        "width": optuna.distributions.FloatDistribution(0, 1),
        "depth": optuna.distributions.FloatDistribution(0, 1),
    }
    ooms, real = 0, []
    for number in range(30):
        trial = study.ask(space)
        area = trial.params["width"] * trial.params["depth"]
        if area <= 0.3:
            study.tell(trial, area)
            real.append((area,))
            continue
        ooms += number >= 15
        told = oom_telling("gp", ["maximize"], real) if told_as_penalty else None
        if told is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, told.values, state=told.state)
    return ooms / 15


@pytest.mark.slow
def test_the_penalty_steers_gp_away_from_what_does_not_fit() -> None:
    """Told FAIL, an OOM trial is invisible to GP, which keeps asking past the edge where
    the values are best; told the penalty, it learns the edge."""
    pytest.importorskip("torch")
    seeds = range(3)
    failed = sum(_oom_share(False, seed) for seed in seeds) / len(seeds)
    penalised = sum(_oom_share(True, seed) for seed in seeds) / len(seeds)
    assert penalised < failed, (penalised, failed)
    assert not math.isnan(penalised)


def test_the_drivers_gp_fits_on_one_thread_and_loads_torch_only_to_fit() -> None:
    """torch's thread per core would take the CPU a `--local` run's trials share."""
    torch = pytest.importorskip("torch")
    from trialq.driver.sampling.gp import OneThreadGP

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        study = optuna.create_study(sampler=OneThreadGP(seed=0, n_startup_trials=2))
        x = optuna.distributions.FloatDistribution(0, 1)
        for _ in range(2):
            trial = study.ask({"x": x})
            study.tell(trial, trial.params["x"])
            assert torch.get_num_threads() == 2, "no model fitted yet"
        study.tell(study.ask({"x": x}), 0.5)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
