"""Optuna's Gaussian-process sampler as the driver runs it: on one CPU thread.

torch, which the sampler fits its models with, starts a thread per core. The driver's models
are small (GP serves short studies), and under `--local` the trials run
on the same cores: a thread per core there takes CPU from the trials (Optuna holds torch to
one thread inside its fit and its optimiser only; 16 GP studies two at a time on 2 cores took
34.3 s without this hold and 11.5 s with it, benchmarks/README.md). torch is imported at the
first model fit, never before: a study that stays in its space-filling start never loads it.
"""

from __future__ import annotations

import logging
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from trialq.driver.sampling.taking_turns import TakingTurns


class _NoGreenletNotice(logging.Filter):
    """Drops Optuna's notice that `greenlet` is missing (it optimises sequentially then):
    it is no fault of the user's, and it printed into the progress once GP was chosen."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for that one notice."""
        return "'greenlet' package is unavailable" not in record.getMessage()


logging.getLogger("optuna._gp.batched_lbfgsb").addFilter(_NoGreenletNotice())

GP_STARTUP_TRIALS = 10
"""Optuna's own default: complete trials before the first model (random draws until then)."""


class OneThreadGP(optuna.samplers.GPSampler):
    """`GPSampler`, quiet about parameters it leaves to random draws (a declared `[space]`
    has none), fitting on one thread."""

    def __init__(self, **args: Any) -> None:
        args.setdefault("warn_independent_sampling", False)
        self._startup = int(args.get("n_startup_trials", GP_STARTUP_TRIALS))
        super().__init__(**args)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """Optuna's, with torch held to one thread once a model is about to be fitted."""
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if search_space and len(complete) >= self._startup:
            import torch

            torch.set_num_threads(1)  # cheap to repeat
        return super().sample_relative(study, trial, search_space)


def gp_and_tpe(seed: int | None = None) -> TakingTurns:
    """`sampler = "gp+tpe"`: GP and Optuna's independent TPE (Optuna 4's `TPESampler()`, a
    model per parameter) taking turns, trial by trial (`taking_turns` says why). Never
    built by `auto`: against the installed `TPESampler(seed)` it lost beyond noise on
    landscapes it was not tuned on (`sampling.rule`)."""
    tpe = optuna.samplers.TPESampler(
        seed=seed, multivariate=False, constant_liar=False, n_startup_trials=10
    )
    return TakingTurns([OneThreadGP(seed=seed), tpe])
