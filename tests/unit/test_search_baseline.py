"""The search benchmark's baseline is what a user would run instead of trialq: the installed
Optuna's `TPESampler(seed=s)`, exactly as constructed (benchmarks/README.md, "Search quality
with trials in flight")."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from benchmarks.parallel_search import (
    BASELINE,
    REDRAWN,
    VARIANTS,
    Case,
    build_sampler,
    noise_floor,
    spec_for,
)

optuna.logging.set_verbosity(optuna.logging.ERROR)


def settings(sampler: optuna.samplers.TPESampler) -> dict[str, Any]:
    """What a `TPESampler` keeps of its constructor's arguments (the seed aside)."""
    return {
        name: value
        for name, value in vars(sampler).items()
        if name not in ("_rng", "_random_sampler", "_search_space")
    }


def draws(sampler: optuna.samplers.BaseSampler) -> list[float]:
    """Twelve asks, told a quadratic: what the seed decides."""
    study = optuna.create_study(sampler=sampler)
    space = {"x": optuna.distributions.FloatDistribution(-1.0, 1.0)}
    found = []
    for _ in range(12):
        trial = study.ask(space)
        found.append(trial.params["x"])
        study.tell(trial, (trial.params["x"] - 0.2) ** 2)
    return found


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("k", [1, 16])
def test_the_baseline_is_the_installed_default_tpe(seed: int, k: int) -> None:
    case = Case("hartmann6", BASELINE, k=k, seed=seed)
    built = build_sampler(case, spec_for(case))
    assert type(built) is optuna.samplers.TPESampler
    assert settings(built) == settings(optuna.samplers.TPESampler(seed=seed))
    again = build_sampler(case, spec_for(case))
    assert draws(again) == draws(optuna.samplers.TPESampler(seed=seed))


def test_the_settings_compared_are_the_ones_that_differ_between_tpes() -> None:
    """The comparison above sees a changed argument (it is no comparison of nothing)."""
    installed = settings(optuna.samplers.TPESampler(seed=0))
    optuna4 = settings(optuna.samplers.TPESampler(seed=0, multivariate=False))
    assert installed != optuna4
    assert settings(optuna.samplers.TPESampler(seed=0, constant_liar=False)) != installed
    assert VARIANTS[BASELINE].installed


def test_the_noise_floor_is_the_baseline_on_other_draws() -> None:
    """`tpe-installed-redrawn` is `TPESampler` as constructed, its seed moved: the same
    sampler, other draws (so a comparison with it measures chance, not a setting)."""
    case = Case("hartmann6", REDRAWN, k=16, seed=3)
    built = build_sampler(case, spec_for(case))
    moved = 3 + VARIANTS[REDRAWN].seed_offset
    assert type(built) is optuna.samplers.TPESampler
    assert settings(built) == settings(optuna.samplers.TPESampler(seed=moved))
    redrawn = draws(build_sampler(case, spec_for(case)))
    assert redrawn == draws(optuna.samplers.TPESampler(seed=moved))
    assert redrawn != draws(optuna.samplers.TPESampler(seed=3))


def test_the_noise_floor_counts_the_cells_chance_put_beyond_noise() -> None:
    worse = {"difference": 1.0, "p05": 0.5, "p95": 2.0}
    better = {"difference": -1.0, "p05": -2.0, "p95": -0.5}
    even = {"difference": 0.0, "p05": -1.0, "p95": 1.0}
    versus = {
        "a": {"k=16 budget=50": worse, "k=16 budget=100": even},
        "b": {"k=16 budget=50": better, "k=16 budget=100": None},
    }
    assert noise_floor(versus) == {
        "cells": 3,
        "worse": ["a k=16 budget=50"],
        "better": ["b k=16 budget=50"],
    }
