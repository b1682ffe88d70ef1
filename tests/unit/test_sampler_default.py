"""What the default, `sampler = "auto"`, and `sampler = "tpe"` build: the installed Optuna's
`TPESampler(seed)`, the same at every budget and number in flight, behind the wrapper that
never proposes a running trial's params."""

from __future__ import annotations

import importlib.util
import logging
import textwrap
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest

from trialq.cli import submit_study_main
from trialq.driver.sampling.distinct import DistinctFromRunning
from trialq.driver.study import make_sampler
from trialq.spec import StudySpec

SPACE = {
    "units": {"type": "int", "low": 0, "high": 5},
    "act": {"type": "categorical", "choices": ["relu", "tanh", "gelu"]},
}


def spec(tmp_path: Path, max_in_flight: int | None, n_trials: int, **study: Any) -> StudySpec:
    return StudySpec.model_validate(
        {
            "path": tmp_path / "spec.toml",
            "study": {
                "name": "s",
                "direction": "minimize",
                "n_trials": n_trials,
                "max_in_flight": max_in_flight,
                **study,
            },
            "trial": {"entrypoint": "mod:train"},
            "space": SPACE,
        }
    )


def tpe(sampler: optuna.samplers.BaseSampler) -> optuna.samplers.TPESampler:
    """The TPE sampler itself, under the wrapper that keeps running params out."""
    if isinstance(sampler, DistinctFromRunning):
        sampler = sampler.sampler
    assert isinstance(sampler, optuna.samplers.TPESampler)
    return sampler


def built(sampler: optuna.samplers.BaseSampler) -> tuple[str, bool | None, bool | None]:
    """(outer class, TPE's multivariate, TPE's constant liar) of what `make_sampler` built
    (multivariate None: Optuna's own default, multivariate on one objective)."""
    inner = getattr(sampler, "sampler", sampler)
    if not isinstance(inner, optuna.samplers.TPESampler):
        return (type(sampler).__name__, None, None)
    return (type(sampler).__name__, inner._multivariate, inner._constant_liar)


DBR = {"search_space": "mod:space"}


@pytest.mark.parametrize(
    ("sampler", "max_in_flight", "n_trials", "fields", "expected"),
    [
        # One in flight: the installed Optuna's TPESampler() (multivariate on one objective,
        # the liar, ten random trials first), its history bounded past 500 finished trials.
        ("auto", 1, 50, {}, ("BoundedTPE", None, True)),
        ("tpe", 1, 200, {}, ("BoundedTPE", None, True)),
        ("auto", 1, 50, DBR, ("BoundedTPE", None, True)),
        # In flight, on a declared space: the same TPE, never a running trial's params again;
        # nothing changes with the budget or the number in flight.
        ("auto", 4, 50, {}, ("DistinctFromRunning", None, True)),
        ("auto", 16, 50, {}, ("DistinctFromRunning", None, True)),
        ("auto", 16, 100, {}, ("DistinctFromRunning", None, True)),
        ("auto", 64, 200, {}, ("DistinctFromRunning", None, True)),
        ("auto", None, 200, {}, ("DistinctFromRunning", None, True)),
        ("tpe", 16, 200, {}, ("DistinctFromRunning", None, True)),
        # A define-by-run space (no space up front): TPE alone.
        ("auto", 16, 50, DBR, ("BoundedTPE", None, True)),
        ("auto", 16, 200, DBR, ("BoundedTPE", None, True)),
        # Other samplers as Optuna builds them.
        ("random", 16, 50, {}, ("RandomSampler", None, None)),
    ],
)  # fmt: skip
def test_the_default_sampler_by_max_in_flight_and_budget(
    tmp_path: Path,
    sampler: str,
    max_in_flight: int | None,
    n_trials: int,
    fields: dict[str, str],
    expected: tuple[str, bool | None, bool | None],
) -> None:
    raw = spec(tmp_path, max_in_flight, n_trials, sampler=sampler).model_dump()
    if fields:
        raw["study"] = raw["study"] | fields
        raw["space"] = {}
    assert built(make_sampler(StudySpec.model_validate(raw))) == expected


def tpe_settings(sampler: optuna.samplers.TPESampler) -> dict[str, Any]:
    """Every setting a `TPESampler` keeps from its constructor (the seed aside)."""
    return {
        "parzen": sampler._parzen_estimator_parameters,
        "n_startup_trials": sampler._n_startup_trials,
        "n_ei_candidates": sampler._n_ei_candidates,
        "gamma": sampler._gamma,
        "multivariate": sampler._multivariate,
        "group": sampler._group,
        "constant_liar": sampler._constant_liar,
        "constraints_func": sampler._constraints_func,
        "warn_independent_sampling": sampler._warn_independent_sampling,
        "estimator": sampler._parzen_estimator_cls,
    }


@pytest.mark.parametrize("max_in_flight", [1, 16, None])
@pytest.mark.parametrize("n_trials", [50, 100, 1000])
def test_auto_is_the_installed_optunas_default_tpe(
    tmp_path: Path, max_in_flight: int | None, n_trials: int
) -> None:
    made = tpe(make_sampler(spec(tmp_path, max_in_flight, n_trials, sampler_args={"seed": 7})))
    assert tpe_settings(made) == tpe_settings(optuna.samplers.TPESampler(seed=7))


def test_the_installed_default_tpe_is_what_the_docs_say() -> None:
    """docs/spec.md ("The default sampler") describes `auto` as Optuna 5's TPESampler():
    an Optuna whose defaults differ fails here, and the docs and the benchmark's figures
    must be measured again."""
    installed = optuna.samplers.TPESampler(seed=0)
    one, two = (optuna.create_study(directions=["minimize"] * n) for n in (1, 2))
    assert installed._is_multivariate(one) and not installed._is_multivariate(two)
    assert installed._constant_liar is True
    assert installed._n_startup_trials == 10


def asked_in_flight(
    sampler: optuna.samplers.BaseSampler,
    space: dict[str, optuna.distributions.BaseDistribution],
    in_flight: int,
    n_trials: int,
) -> list[dict[str, Any]]:
    """The params of `n_trials` asks with up to `in_flight` running, the oldest told first
    (a quadratic of the numbers in the params, a cost for one choice)."""
    study = optuna.create_study(sampler=sampler)
    running: list[optuna.Trial] = []
    asked = []
    while len(asked) < n_trials:
        if len(running) == in_flight:
            oldest = running.pop(0)
            study.tell(oldest, sum(_loss(v) for v in oldest.params.values()))
        trial = study.ask(space)
        asked.append(trial.params)
        running.append(trial)
    return asked


def _loss(value: Any) -> float:
    return float(value == "relu") if isinstance(value, str) else (float(value) - 1.3) ** 2


FLOATS = {
    "lr": optuna.distributions.FloatDistribution(1e-5, 1.0, log=True),
    "x": optuna.distributions.FloatDistribution(-2.0, 4.0),
    "y": optuna.distributions.FloatDistribution(0.0, 3.0),
}
FLOAT_SPACE = {
    "lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
    "x": {"type": "float", "low": -2.0, "high": 4.0},
    "y": {"type": "float", "low": 0.0, "high": 3.0},
}


@pytest.mark.parametrize("seed", [0, 1])
def test_in_flight_auto_asks_what_optunas_default_tpe_asks(tmp_path: Path, seed: int) -> None:
    """16 in flight on a continuous space: the wrapper never redraws (no proposal equals a
    running trial's), so the study is `TPESampler(seed)`'s, trial for trial."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    raw = spec(tmp_path, 16, 60, sampler_args={"seed": seed}).model_dump() | {"space": FLOAT_SPACE}
    ours = asked_in_flight(make_sampler(StudySpec.model_validate(raw)), FLOATS, 16, 60)
    theirs = asked_in_flight(optuna.samplers.TPESampler(seed=seed), FLOATS, 16, 60)
    assert ours == theirs


def test_a_larger_budget_draws_its_first_trials_as_a_smaller_one(tmp_path: Path) -> None:
    """No switch by `n_trials`: a 200-trial study's first 50 trials are a 50-trial study's."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = {
        "units": optuna.distributions.IntDistribution(0, 5),
        "act": optuna.distributions.CategoricalDistribution(["relu", "tanh", "gelu"]),
        **FLOATS,
    }
    raw = spec(tmp_path, 16, 50, sampler_args={"seed": 3}).model_dump()
    raw["space"] = {**SPACE, **FLOAT_SPACE}
    first = {}
    for n_trials in (50, 100, 200):
        raw["study"]["n_trials"] = n_trials
        sampler = make_sampler(StudySpec.model_validate(raw))
        first[n_trials] = asked_in_flight(sampler, space, 16, 50)
    assert first[50] == first[100] == first[200]


def test_sampler_args_override_each_default(tmp_path: Path) -> None:
    args = {"multivariate": False, "constant_liar": False, "n_startup_trials": 20}
    sampler = tpe(make_sampler(spec(tmp_path, 16, 200, sampler_args=args)))
    assert sampler._multivariate is False
    assert sampler._constant_liar is False
    assert sampler._n_startup_trials == 20


def duplicates_of_running(sampler: optuna.samplers.BaseSampler, in_flight: int) -> int:
    """Asks with `in_flight` trials running, telling the oldest each time: how many asks
    proposed params equal to a trial still running."""
    study = optuna.create_study(sampler=sampler)
    distributions = {
        "units": optuna.distributions.IntDistribution(0, 5),
        "act": optuna.distributions.CategoricalDistribution(["relu", "tanh", "gelu"]),
    }
    running: list[optuna.Trial] = []
    duplicates = 0
    for _ in range(60):
        if len(running) == in_flight:
            oldest = running.pop(0)
            value = (oldest.params["units"] - 2) ** 2 + (oldest.params["act"] != "tanh")
            study.tell(oldest, value)
        trial = study.ask(distributions)
        duplicates += any(trial.params == other.params for other in running)
        running.append(trial)
    return duplicates


@pytest.mark.parametrize("n_trials", [50, 200])
def test_the_default_tpe_proposes_fewer_running_params_again_than_optuna4s(
    tmp_path: Path, n_trials: int
) -> None:
    """TPE itself, without the wrapper: the pinned arguments (the constant liar) help."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    seeded = {"sampler": "tpe", "sampler_args": {"seed": 1}}
    optuna4 = {"sampler_args": {"seed": 1, "multivariate": False, "constant_liar": False}}
    default = duplicates_of_running(tpe(make_sampler(spec(tmp_path, 4, n_trials, **seeded))), 4)
    baseline = duplicates_of_running(tpe(make_sampler(spec(tmp_path, 4, n_trials, **optuna4))), 4)
    assert default < baseline


@pytest.mark.slow
@pytest.mark.parametrize("n_trials", [50, 200])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_default_proposes_nothing_already_running(tmp_path: Path, n_trials: int, seed: int) -> None:
    """The constant liar alone still proposed running params on this space of 18 points
    (the test above: fewer than Optuna 4's TPE, not none); the wrapper draws again."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    seeded = {"sampler": "tpe", "sampler_args": {"seed": seed}}
    assert duplicates_of_running(make_sampler(spec(tmp_path, 4, n_trials, **seeded)), 4) == 0
    unwrapped = tpe(make_sampler(spec(tmp_path, 4, n_trials, **seeded)))
    assert duplicates_of_running(unwrapped, 4) > 0, "the case no longer needs the wrapper"


def test_a_space_smaller_than_the_flight_still_gets_its_trials(tmp_path: Path) -> None:
    """Six points, eight in flight: some asks must repeat a running set, and they do rather
    than stall the driver."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    small = {"units": {"type": "int", "low": 0, "high": 1}, "act": SPACE["act"]}
    raw = spec(tmp_path, 8, 50, sampler="tpe", sampler_args={"seed": 0}).model_dump()
    raw["space"] = small
    study = optuna.create_study(sampler=make_sampler(StudySpec.model_validate(raw)))
    space = {
        "units": optuna.distributions.IntDistribution(0, 1),
        "act": optuna.distributions.CategoricalDistribution(["relu", "tanh", "gelu"]),
    }
    trials = [study.ask(space) for _ in range(8)]
    distinct = {tuple(sorted(t.params.items())) for t in trials}
    assert len(distinct) == 6


@pytest.mark.parametrize(
    ("max_in_flight", "study_fields", "wrapped"),
    [(4, {}, True), (None, {}, True), (1, {}, False), (4, {"sampler": "random"}, False),
     (4, {"search_space": "mod:space"}, False)],
)  # fmt: skip
def test_only_tpe_with_trials_in_flight_on_a_declared_space_is_wrapped(
    tmp_path: Path, max_in_flight: int | None, study_fields: dict[str, str], wrapped: bool
) -> None:
    raw = spec(tmp_path, max_in_flight, 200).model_dump()
    raw["study"] = raw["study"] | study_fields
    if "search_space" in study_fields:
        raw["space"] = {}
    sampler = make_sampler(StudySpec.model_validate(raw))
    assert isinstance(sampler, DistinctFromRunning) is wrapped


def test_cmaes_without_its_package_is_refused_before_the_study_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec("cmaes") is not None:
        pytest.skip("the cmaes package is installed here")
    spec_path = tmp_path / "study.toml"
    spec_path.write_text(
        textwrap.dedent(
            """
            [study]
            name = "cma"
            n_trials = 2
            sampler = "cmaes"
            [trial]
            entrypoint = "trials:quadratic"
            [space.x]
            type = "float"
            low = 0
            high = 1
            """
        )
    )
    database = tmp_path / "cma.db"

    code = submit_study_main([str(spec_path), "--storage", f"sqlite:///{database}", "--local"])

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "study.sampler" in err[0] and "trialq[cmaes]" in err[0]
    assert not database.exists()


def test_optunas_experimental_and_greenlet_notices_stay_out_of_the_progress(
    tmp_path: Path,
) -> None:
    raw = spec(tmp_path, 1, 200).model_dump() | {"space": {}}
    grouped = {"search_space": "mod:space", "sampler_args": {"multivariate": True, "group": True}}
    raw["study"] = raw["study"] | grouped
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tpe(make_sampler(StudySpec.model_validate(raw)))  # group=True: experimental in Optuna
    assert [w for w in caught if issubclass(w.category, optuna.exceptions.ExperimentalWarning)] == []

    import trialq.driver.sampling.gp  # noqa: F401  (installs the filter, as the driver does)

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    notices = logging.getLogger("optuna._gp.batched_lbfgsb")
    level = notices.level  # other tests here set Optuna's verbosity to ERROR, above warnings
    notices.setLevel(logging.WARNING)
    notices.addHandler(handler)
    try:
        notices.warning("The 'greenlet' package is unavailable, falling back to sequential")
        notices.warning("any other warning")
    finally:
        notices.removeHandler(handler)
        notices.setLevel(level)
    assert seen == ["any other warning"]
