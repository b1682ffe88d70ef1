"""`[study.pruner_args]` held to what the pruner accepts, before the study exists.

Optuna's pruners check some of their arguments when built and others only when they first
prune: Hyperband's `min_resource = 0`, `reduction_factor = 1` or `bootstrap_count = -1` were
built without a word and ended the run mid-study (a division by zero, a math domain error),
with its trials left RUNNING; floats where counts belong (`reduction_factor = 2.5`) failed
the same way or were taken silently. So each argument is checked against the type the
pruner's signature declares and the range its meaning allows, and then the pruner is
rehearsed: run over a small study of its own in memory, as the driver will run it, so a
value that fails only when pruning fails here, as one line (exit 2).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import optuna

from trialq.driver.sampling.args import check_sampler_args
from trialq.errors import SpecError

AT_LEAST: Mapping[str, float] = {
    "n_startup_trials": 0,
    "n_warmup_steps": 0,
    "interval_steps": 1,
    "n_min_trials": 1,
    "min_resource": 1,
    "max_resource": 1,
    "reduction_factor": 2,
    "min_early_stopping_rate": 0,
    "bootstrap_count": 0,
}
"""The pruners' counts and steps, and the least each takes."""
RESOURCES = ("min_resource", "max_resource")
"""Steps a pruner takes as a number or the word "auto" (found from the trials)."""
REHEARSAL_TRIALS = 12
REHEARSAL_STEPS = 30
"""The rehearsal's study: enough trials and steps for each pruner to prune a few times."""
storage_log = logging.getLogger(optuna.storages.InMemoryStorage.__module__)


def check_pruner_args(factory: Callable[..., Any], args: Mapping[str, Any], key: str) -> None:
    """Raise `SpecError` ("`key`.NAME: ...") for the first argument of the wrong type, past
    its range, or naming a resource other than a number or "auto"."""
    numbers = {k: v for k, v in args.items() if not (k in RESOURCES and v == "auto")}
    check_sampler_args(factory, numbers, key, at_least=AT_LEAST)
    for name in RESOURCES:
        if isinstance(args.get(name), str) and args[name] != "auto":
            raise SpecError(f"{key}.{name}: {args[name]!r}: use a number of steps or 'auto'")
    low, high = args.get("min_resource"), args.get("max_resource")
    if isinstance(low, int) and isinstance(high, int) and high < low:
        raise SpecError(f"{key}.max_resource: {high} is below min_resource ({low})")


def rehearse(pruner: optuna.pruners.BasePruner, key: str) -> None:
    """Prune a small study in memory with `pruner`; raise `SpecError` naming what it fails
    with, where it fails. The pruner learns from what it prunes (Hyperband sizes its
    brackets from the first trials): rehearse one built for the purpose."""
    storage = optuna.storages.InMemoryStorage()
    with _quiet(storage_log):  # no "A new study created" line for the user
        storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], "rehearsal")
    study = optuna.Study("rehearsal", storage, optuna.samplers.RandomSampler(seed=0), pruner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for number in range(REHEARSAL_TRIALS):
                _rehearse_one(study, number)
        except Exception as exc:  # whatever it fails with, it would fail mid-study
            raise SpecError(f"{key}: the pruner fails when it prunes: {_named(exc)}") from None


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def _rehearse_one(study: optuna.Study, number: int) -> None:
    trial = study.ask()
    for step in range(REHEARSAL_STEPS):
        trial.report(float((number * 7 + step * 3) % 11), step)
        if trial.should_prune():
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
    study.tell(trial, float(number))


def _named(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
