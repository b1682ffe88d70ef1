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


class DrawnHere:
    """Who answers a trial's `suggest_*` in a run here, for an objective that draws its own
    params: a trial of an in-memory study with `--params` enqueued, so a name given is its
    value and any other is drawn by Optuna's sampler (and printed); Optuna's own checks and
    errors hold. Nothing prunes here: no verdict."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study()
        study.enqueue_trial(dict(params))
        self.trial = study.ask()
        self._given = set(params)

    def suggest(self, name: str, distribution: dict[str, Any]) -> Any:
        """The value of `name`: as given in `--params`, else drawn here."""
        from optuna.distributions import json_to_distribution

        from trialq.driver.answering import suggest

        value = suggest(self.trial, name, json_to_distribution(json.dumps(distribution)))
        if name not in self._given:
            print(f"suggest {name}: {value!r} (drawn here: not in --params)", file=sys.stderr)
        return value

    def judge(self, step: int, value: float) -> bool | None:
        """No pruner runs here: never a verdict."""
        return None


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
    when it raised (its traceback shown). With `tell`, add it to the study as finished.
    `trial.number` is the number the study would give it next."""
    spec = load_spec(spec_path)
    space: dict[str, optuna.distributions.BaseDistribution] = {}
    if spec.trial_suggests:
        params = _given_params(params_text)
        drawn: DrawnHere | None = DrawnHere(params)
    else:
        (params, space), drawn = parsed_params(spec, params_text), None
    reports = PrintedReports()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trialq-run-trial-") as folder:
        context = TrialContext(
            TrialAddress(spec.study.name, _next_number(spec, storage), 1),
            {} if drawn is not None else params,  # an objective's: each drawn as it asks
            reports,
            checkpoint_dir=Path(folder) / "checkpoints",
            questions=drawn,
        )
        metrics, state = _call_here(spec, params, context)
    if drawn is not None:  # what the objective drew is what the study is told
        params, space = dict(drawn.trial.params), dict(drawn.trial.distributions)
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
        returned = call_train(train, params, context, suggests=spec.trial_suggests)
        return numeric_metrics(returned), optuna.trial.TrialState.COMPLETE
    except TrialPruned:
        return None, optuna.trial.TrialState.PRUNED
    except optuna.TrialPruned:  # code written for Optuna prunes so; a worker takes it too
        return None, optuna.trial.TrialState.PRUNED
    except Exception:
        import traceback

        traceback.print_exc()
        return None, optuna.trial.TrialState.FAIL


def _given_params(text: str) -> dict[str, Any]:
    """`--params` as a JSON object, for an objective that draws its own: any names."""
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"run-trial: --params is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise UsageError("run-trial: --params must be a JSON object of param names to values")
    return params


def _next_number(spec: StudySpec, storage: str | None) -> int:
    """The number the study would give the next trial: 0 where it has none yet (or its
    storage cannot be read: a run here needs none)."""
    from trialq.settings import Settings

    url = storage_url(spec, storage, Settings().storage)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return 0
    try:
        summaries = optuna.study.get_all_study_summaries(url)
    except Exception:  # unreachable or not a study database: numbered from 0
        return 0
    found = [s for s in summaries if s.study_name == spec.study.name]
    return found[0].n_trials if found else 0


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
