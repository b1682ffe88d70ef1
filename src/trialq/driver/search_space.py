"""The spec's define-by-run search space (`study.search_space`), loaded once by the driver.

The driver runs this function by design (docs/design.md, rule (a)): it asks the study for a
trial and lets the function sample its params. The reference is resolved from the spec's
folder, like the trial entrypoint, and imported once, before the study is created: a space
that cannot load is refused with one line, and a module's body never runs again per ask.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from trialq.driver.study import distributions
from trialq.errors import EntrypointError, SpecError
from trialq.spec import StudySpec
from trialq.wire.entrypoint import importable_from

DefineSpace = Callable[[optuna.Trial], object]
"""Samples a trial's params with `trial.suggest_*`; what it returns is ignored."""


def load_search_space(spec: StudySpec) -> DefineSpace | None:
    """Import the spec's search space function (None for `[space.*]` tables); `SpecError`
    naming the spec and the key when it cannot be loaded."""
    ref = spec.study.search_space
    if ref is None:
        return None
    where = f"{spec.where}: study.search_space"
    try:
        with importable_from(spec.directory):
            return ref.resolved(spec.directory).load()
    except EntrypointError as exc:
        raise SpecError(f"{where}: {exc}") from None
    except Exception as exc:  # the user's module body failed: one line, not a traceback
        reason = (str(exc).strip().splitlines() or [""])[0]
        raise SpecError(
            f"{where}: importing {ref.target} failed: {type(exc).__name__}: {reason}"
        ) from None


def ask_new(study: optuna.Study, spec: StudySpec, define_space: DefineSpace | None) -> optuna.Trial:
    """A new trial of `study`, its params drawn from the spec's space: the `[space.*]` tables
    at once, or by the define-by-run function (`define_space`, loaded by the caller)."""
    if spec.space:
        return study.ask(distributions(spec))
    if spec.trial_suggests:  # what every finished trial drew travels with the task
        return study.ask(seen_space(study))
    assert define_space is not None, "a spec without [space.*] names search_space"
    trial = study.ask()
    define_space(trial)
    return trial


def seen_space(study: optuna.Study) -> dict[str, optuna.distributions.BaseDistribution]:
    """The params every finished trial (complete or pruned) drew, each with its one
    distribution: Optuna's intersection search space, the static part of a define-by-run
    space, which its relative samplers model jointly. A trial whose function suggests its
    own params gets these drawn at ask time; any other name it suggests is drawn when asked
    (`trialq.driver.answering`)."""
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    return optuna.search_space.intersection_search_space(finished)
