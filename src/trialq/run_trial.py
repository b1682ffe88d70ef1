"""`trialq run-trial SPEC --params '{...}'`: one trial of a spec in this very process.

For debugging a trial's code: a breakpoint, `python -m pdb`, a profiler all work, since no
worker, broker or fork stands between the command and the entrypoint. The trial gets the
same `trial` object a worker gives it (`report`, `should_prune`, `checkpoint_dir`, ...); its
reports are printed, nothing prunes or stops it, and the study is told nothing unless
`--tell` asks (then the trial is added to it as finished, with its reports).
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna

from trialq.driver.objective import objective_values
from trialq.driver.search_space import load_search_space
from trialq.driver.study import distributions, open_study, storage_url
from trialq.errors import TrialPruned, UsageError
from trialq.spec import StudySpec, load_spec
from trialq.trial.context import TrialContext
from trialq.trial.runner import call_train, numeric_metrics
from trialq.wire.channel import TrialAddress
from trialq.wire.entrypoint import importable_from

RUN_HERE_NUMBER = -1
"""The trial number `trial.number` shows in a run here: no study numbered it."""


class PrintedReports:
    """Where a trial run here reports: each value printed as it comes, and kept."""

    def __init__(self) -> None:
        self.values: dict[int, float] = {}

    def report(self, address: TrialAddress, step: int, value: float) -> None:
        """Print and keep one report."""
        self.values[step] = value
        print(f"report step {step}: {value:.6g}", file=sys.stderr)

    def prune_requested(self, address: TrialAddress) -> bool:
        """No pruner runs here: never."""
        return False

    def stop_requested(self, address: TrialAddress) -> bool:
        """No worker stops here: never."""
        return False


def parsed_params(
    spec: StudySpec, text: str
) -> tuple[dict[str, Any], dict[str, optuna.distributions.BaseDistribution]]:
    """`--params` as a JSON object, each name and value inside the spec's space, with the
    distributions they are drawn from (`space_of`); one line saying what is wrong else."""
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"run-trial: --params is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise UsageError("run-trial: --params must be a JSON object of param names to values")
    space = space_of(spec, params)
    _check_in_space(params, space)
    return params, space


def space_of(
    spec: StudySpec, params: Mapping[str, Any]
) -> dict[str, optuna.distributions.BaseDistribution]:
    """The distributions `params` are drawn from: the spec's `[space.*]`, or those its
    define-by-run `search_space` suggests when it is run on these very params (Optuna's
    `FixedTrial`), so a conditional space names the branch they take."""
    define = load_search_space(spec)
    if define is None:
        return distributions(spec)
    fixed = optuna.trial.FixedTrial(dict(params))
    try:
        with warnings.catch_warnings():  # a value out of range: said below, in one line
            warnings.simplefilter("ignore")
            define(fixed)  # type: ignore[arg-type]  # FixedTrial: Trial's suggest_* API
    except ValueError as exc:  # FixedTrial's: a param the space asks for is not given
        found = re.search(r"parameter '(.+?)' is not found", str(exc))
        what = f"missing {found.group(1)}" if found else str(exc).split(". ")[0]
        raise UsageError(f"run-trial: --params: {what} (study.search_space asks for it)") from None
    except Exception as exc:  # the user's space function failed on these params: one line
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            f"run-trial: study.search_space failed on --params: {type(exc).__name__}: {reason}"
        ) from None
    return dict(fixed.distributions)


def _check_in_space(
    params: Mapping[str, Any], space: Mapping[str, optuna.distributions.BaseDistribution]
) -> None:
    unknown = sorted(set(params) - set(space))
    missing = sorted(set(space) - set(params))
    if unknown or missing:
        what = f"unknown {', '.join(unknown)}" if unknown else f"missing {', '.join(missing)}"
        raise UsageError(f"run-trial: --params: {what} (the space has {', '.join(space)})")
    for name, value in params.items():
        if not _contains(space[name], value):
            raise UsageError(f"run-trial: --params: {name} = {value!r} is outside space.{name}")


def _contains(distribution: optuna.distributions.BaseDistribution, value: Any) -> bool:
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except (TypeError, ValueError):
        return False


def run_here(spec_path: Path, params_text: str, tell: bool, storage: str | None) -> int:
    """Run one trial here and print its metrics (JSON on stdout); 0 when it returned, 1
    when it raised (its traceback shown). With `tell`, add it to the study as finished."""
    spec = load_spec(spec_path)
    params, space = parsed_params(spec, params_text)
    reports = PrintedReports()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trialq-run-trial-") as folder:
        context = TrialContext(
            TrialAddress(spec.study.name, RUN_HERE_NUMBER, 1),
            params,
            reports,
            checkpoint_dir=Path(folder) / "checkpoints",
        )
        metrics, state = _call_here(spec, params, context)
    print(f"trial {state.name.lower()} in {time.monotonic() - started:.3f} s", file=sys.stderr)
    if metrics is not None:
        print(json.dumps(metrics))
    if tell:
        _tell(spec, storage, params, space, metrics, state, reports.values)
    return 1 if state is optuna.trial.TrialState.FAIL else 0


def _call_here(
    spec: StudySpec, params: dict[str, Any], context: TrialContext
) -> tuple[dict[str, float] | None, optuna.trial.TrialState]:
    """The entrypoint's metrics and the state a worker would end it in (its error shown)."""
    entrypoint = spec.trial.entrypoint.resolved(spec.directory)
    try:
        with importable_from(spec.directory, Path.cwd()):
            train = entrypoint.load()
        return numeric_metrics(call_train(train, params, context)), optuna.trial.TrialState.COMPLETE
    except TrialPruned:
        return None, optuna.trial.TrialState.PRUNED
    except optuna.TrialPruned:  # code written for Optuna prunes so; a worker takes it too
        return None, optuna.trial.TrialState.PRUNED
    except Exception:
        import traceback

        traceback.print_exc()
        return None, optuna.trial.TrialState.FAIL


def _tell(
    spec: StudySpec,
    storage: str | None,
    params: dict[str, Any],
    space: dict[str, optuna.distributions.BaseDistribution],
    metrics: dict[str, float] | None,
    state: optuna.trial.TrialState,
    reports: dict[int, float],
) -> None:
    """Add the trial to the study, finished, with its reports and metrics."""
    from trialq.settings import Settings

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(spec, storage_url(spec, storage, Settings().storage))
    values = None
    if metrics is not None:
        values = objective_values(metrics, spec.study.objective_metrics)
    trial = optuna.trial.create_trial(
        state=state,
        params=params,
        distributions=space,
        values=values,
        intermediate_values=reports,
        user_attrs={"outcome": "ok" if values else state.name.lower(), "run_here": True},
    )
    study.add_trial(trial)
    print(f"told study {study.study_name!r}: trial #{study.trials[-1].number}", file=sys.stderr)
