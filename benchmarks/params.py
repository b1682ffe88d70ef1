"""The parameter sets of the overhead benchmark: one seeded Optuna study, asked up front."""

from __future__ import annotations

from typing import Any

import optuna

SPACE: dict[str, optuna.distributions.BaseDistribution] = {
    "x": optuna.distributions.FloatDistribution(-1.0, 1.0),
    "units": optuna.distributions.IntDistribution(4, 32),
    "learning_rate": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
    "seed": optuna.distributions.IntDistribution(0, 10_000),
}


def sample_params(n_trials: int, seed: int = 0) -> list[dict[str, Any]]:
    """Parameter sets from one seeded Optuna study, so every approach runs the same trials."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    params = []
    for _ in range(n_trials):
        trial = study.ask(SPACE)
        params.append(dict(trial.params))
        study.tell(trial, 0.0)
    return params
