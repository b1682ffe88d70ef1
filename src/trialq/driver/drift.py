"""A spec that no longer matches the study it resumes: refused, or accepted with a note.

Optuna keeps a study's directions and its trials' distributions; trialq keeps the rest of
what a spec decided (its metrics and sampler) as the study's user attr `trialq_spec`, so a
re-run can compare them. Per key (docs/design.md, "A changed spec"):
- directions, metrics: refused. The stored trials' values would mean something else, and
  "best" would be the best of another objective.
- a param whose type, log scale or choices changed: refused. Optuna cannot sample it beside
  the stored trials (and would fail at the first ask, after trials were sent).
- a param added or removed, bounds or steps changed, the sampler or pruner changed: accepted,
  with one line each. The stored trials stay valid observations.
"""

from __future__ import annotations

from typing import Any

import optuna

from trialq.driver._storage.store import TrialStore
from trialq.driver.study import distributions
from trialq.errors import SpecError
from trialq.spec import StudySpec

SPEC_ATTR = "trialq_spec"
"""The study user attr that keeps what the spec decided beyond what Optuna stores."""


def recorded_spec(spec: StudySpec) -> dict[str, Any]:
    """What a re-run compares with its spec, besides the directions and distributions."""
    return {
        "metrics": list(spec.study.objective_metrics or []),
        "sampler": spec.study.sampler,
        "pruner": spec.study.pruner,
        "space": _shown_space(spec),
        "entrypoint": spec.trial_identity,
    }


def check_spec_against_study(spec: StudySpec, study: optuna.Study, store: TrialStore) -> list[str]:
    """Raise `SpecError` for a change the stored trials cannot survive; return one line for
    each change that is safe. Records the spec's choices on the study for the next run,
    through `store`."""
    _check_directions(spec, study)
    stored = study.user_attrs.get(SPEC_ATTR, {})
    _check_metrics(spec, stored)
    _check_entrypoint(spec, stored)
    notes = _space_notes(spec, study, stored)
    current = recorded_spec(spec)
    for key in ("sampler", "pruner"):
        if key in stored and stored[key] != current[key]:
            notes.append(
                f"study.{key} changed from {stored[key]!r} to {current[key]!r}; "
                "the stored trials are kept"
            )
    if stored != current:
        store.set_study_attr(SPEC_ATTR, current)
    return notes


def _check_directions(spec: StudySpec, study: optuna.Study) -> None:
    stored = [d.name.lower() for d in study.directions]
    wanted = list(spec.study.objective_directions)
    if stored == wanted:
        return
    if len(stored) == 1 and len(wanted) == 1:
        raise _refused(spec, "study.direction", stored[0], wanted[0])
    raise _refused(spec, "study.directions", stored, wanted)


def _check_metrics(spec: StudySpec, stored: dict[str, Any]) -> None:
    wanted = list(spec.study.objective_metrics or [])
    before = stored.get("metrics", wanted)
    if before == wanted:
        return
    if len(before) <= 1 and len(wanted) <= 1:
        raise _refused(spec, "study.metric", _one(before), _one(wanted))
    raise _refused(spec, "study.metrics", before, wanted)


def _check_entrypoint(spec: StudySpec, stored: dict[str, Any]) -> None:
    """Another trial function under the same study name is refused: resuming would mix its
    trials with another function's, and hand back that function's best params."""
    before = stored.get("entrypoint")
    if before is None or before == spec.trial_identity:
        return
    raise SpecError(
        f"{spec.where}: the study {spec.study.name!r} was run with the trial function "
        f"{before}, not {spec.trial_identity}: give this one another study name (name=...), "
        "or delete the old study (optuna delete-study)"
    )


def _one(metrics: list[str]) -> str:
    return metrics[0] if metrics else "no metric (a lone returned value)"


def _space_notes(spec: StudySpec, study: optuna.Study, stored: dict[str, Any]) -> list[str]:
    """Refuse a param the stored trials cannot share; note what changed since the last run."""
    if not spec.space:
        return []  # a define-by-run space is checked by Optuna as it asks
    known: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            known.setdefault(name, distribution)
    wanted = distributions(spec)
    for name in sorted(known.keys() & wanted.keys()):
        try:
            optuna.distributions.check_distribution_compatibility(known[name], wanted[name])
        except ValueError:
            was, now = _shown(known[name]), _shown(wanted[name])
            raise _refused(spec, f"space.{name}", was, now) from None
    before: dict[str, str] = stored.get("space") or {n: _shown(d) for n, d in known.items()}
    after = _shown_space(spec)
    if not before:
        return []
    notes = [
        f"space.{name} changed from {before[name]} to {after[name]}; the stored trials are kept"
        for name in sorted(before.keys() & after.keys())
        if before[name] != after[name]
    ]
    added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    if added or removed:
        change = ", ".join([f"+{n}" for n in added] + [f"-{n}" for n in removed])
        notes.append(f"space changed ({change}); the stored trials are kept")
    return notes


def _shown_space(spec: StudySpec) -> dict[str, str]:
    return {name: _shown(d) for name, d in distributions(spec).items()}


def _shown(distribution: optuna.distributions.BaseDistribution) -> str:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return f"categorical {list(distribution.choices)}"
    assert isinstance(
        distribution, optuna.distributions.FloatDistribution | optuna.distributions.IntDistribution
    )
    kind = "float" if isinstance(distribution, optuna.distributions.FloatDistribution) else "int"
    scale = " log" if distribution.log else ""
    step = f" step {distribution.step}" if distribution.step not in (None, 1) else ""
    return f"{kind} [{distribution.low}, {distribution.high}]{scale}{step}"


def _refused(spec: StudySpec, key: str, stored: object, wanted: object) -> SpecError:
    return SpecError(
        f"{spec.where}: {key}: the study {spec.study.name!r} was made with {stored}, the spec "
        f"says {wanted}; its trials would mislead the search. Give the study a new name, or "
        "delete the old one (optuna delete-study)"
    )
