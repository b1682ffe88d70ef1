"""A seeded study resumed (the documented way to add trials) draws new parameters: its
run's seed is derived from the study's seed and the trials it holds. With the study's seed
again, the random sampler replayed every trial it had run (seed 7: trials 6-11 were 0-5)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from bad_inputs import spec_text

from trialq.driver.study import distributions, open_study, release_connections
from trialq.spec import StudySpec, load_spec


def _spec(write_spec: Callable[..., Path], sampler: str) -> StudySpec:
    study = f'name = "seeded"\nn_trials = 6\nsampler = "{sampler}"\nsampler_args = {{ seed = 7 }}'
    space = '[space.x]\ntype = "float"\nlow = 0\nhigh = 1\n[space.n]\ntype = "int"\nlow = 0\nhigh = 1000'
    return load_spec(write_spec(spec_text(study=study, space=space)))


def _run(spec: StudySpec, url: str, n: int) -> list[dict[str, object]]:
    """Open the study as the driver does, ask and tell `n` trials; the params drawn."""
    study = open_study(spec, url)
    drawn = []
    for _ in range(n):
        trial = study.ask(distributions(spec))
        study.tell(trial, 0.0)
        drawn.append(trial.params)
    release_connections(study)
    return drawn


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_resumed_seeded_study_draws_new_params(
    sampler: str, write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = _spec(write_spec, sampler)
    url = f"sqlite:///{tmp_path / 'seeded.db'}"

    first = _run(spec, url, 6)
    shutil.copy(tmp_path / "seeded.db", tmp_path / "copy.db")
    resumed = _run(spec, url, 6)

    assert not any(params in first for params in resumed), (first, resumed)
    assert _run(spec, f"sqlite:///{tmp_path / 'copy.db'}", 6) == resumed, "not reproducible"


def test_a_seeded_study_first_run_draws_what_its_seed_draws(
    write_spec: Callable[..., Path], tmp_path: Path
) -> None:
    spec = _spec(write_spec, "random")
    optuna_alone = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=7))
    expected = [optuna_alone.ask(distributions(spec)).params for _ in range(6)]

    assert _run(spec, f"sqlite:///{tmp_path / 'seeded.db'}", 6) == expected
