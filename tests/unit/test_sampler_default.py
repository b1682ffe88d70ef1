"""What `sampler = "tpe"` means: pinned arguments, chosen by max_in_flight and n_trials."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from typing import Any

import optuna
import pytest

from trialq.cli import submit_study_main
from trialq.driver.distinct import DistinctFromRunning
from trialq.driver.spec import StudySpec
from trialq.driver.study import make_sampler

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


@pytest.mark.parametrize(
    ("max_in_flight", "n_trials", "multivariate"),
    [(1, 200, True), (16, 50, True), (16, 100, False), (None, 200, False)],
)
def test_tpe_is_pinned_by_max_in_flight_and_budget(
    tmp_path: Path, max_in_flight: int | None, n_trials: int, multivariate: bool
) -> None:
    sampler = tpe(make_sampler(spec(tmp_path, max_in_flight, n_trials)))
    assert sampler._multivariate is multivariate
    assert sampler._constant_liar is True


def test_sampler_args_override_each_default(tmp_path: Path) -> None:
    args = {"multivariate": True, "constant_liar": False}
    sampler = tpe(make_sampler(spec(tmp_path, 16, 200, sampler_args=args)))
    assert sampler._multivariate is True
    assert sampler._constant_liar is False


def test_group_only_where_multivariate_on_a_define_by_run_space(tmp_path: Path) -> None:
    fields = {"search_space": "mod:space"}
    raw = spec(tmp_path, 1, 200).model_dump() | {"space": {}}
    raw["study"] = raw["study"] | fields
    grouped = tpe(make_sampler(StudySpec.model_validate(raw)))
    assert grouped._group is True
    raw["study"] = raw["study"] | {"sampler_args": {"multivariate": False}}
    assert tpe(make_sampler(StudySpec.model_validate(raw)))._group is False


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
    seeded = {"sampler_args": {"seed": 1}}
    optuna4 = {"sampler_args": {"seed": 1, "multivariate": False, "constant_liar": False}}
    default = duplicates_of_running(tpe(make_sampler(spec(tmp_path, 4, n_trials, **seeded))), 4)
    baseline = duplicates_of_running(tpe(make_sampler(spec(tmp_path, 4, n_trials, **optuna4))), 4)
    assert default < baseline


@pytest.mark.parametrize("n_trials", [50, 200])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_default_proposes_nothing_already_running(tmp_path: Path, n_trials: int, seed: int) -> None:
    """The constant liar alone still proposed running params on this space of 18 points
    (the test above: fewer than Optuna 4's TPE, not none); the wrapper draws again."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    seeded = {"sampler_args": {"seed": seed}}
    assert duplicates_of_running(make_sampler(spec(tmp_path, 4, n_trials, **seeded)), 4) == 0
    unwrapped = tpe(make_sampler(spec(tmp_path, 4, n_trials, **seeded)))
    assert duplicates_of_running(unwrapped, 4) > 0, "the case no longer needs the wrapper"


def test_a_space_smaller_than_the_flight_still_gets_its_trials(tmp_path: Path) -> None:
    """Six points, eight in flight: some asks must repeat a running set, and they do rather
    than stall the driver."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    small = {"units": {"type": "int", "low": 0, "high": 1}, "act": SPACE["act"]}
    raw = spec(tmp_path, 8, 50, sampler_args={"seed": 0}).model_dump() | {"space": small}
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
