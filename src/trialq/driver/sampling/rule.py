"""Which sampler `sampler = "auto"` (the default) builds: deciding only, nothing built here.

The rule comes from `python -m benchmarks.parallel_search` (benchmarks/README.md, "Search
quality with trials in flight"; docs/spec.md, "The default sampler"). A GPU study is short
and wide: tens of trials, many in flight. There Optuna's Gaussian-process sampler, whose
acquisition counts the running trials (Monte Carlo fantasies of their results), found better
parameters than TPE with a constant liar, behind the same space-filling start (issue 29);
taking turns with independent TPE keeps it from falling far behind where the landscape is
separable (`taking_turns`).
Everywhere else TPE stays: with one trial in flight there is no gap to close and GP lost the
training objective (0.608 against 0.467, 20 seeds, measured before GP learnt from
out-of-memory trials), at 100 trials and more TPE's ask stays in milliseconds where GP's
grows to a second, a define-by-run space changes under GP's fixed one, and several
objectives and user-tuned TPE arguments were not measured with GP.
"""

from __future__ import annotations

import importlib.util

from trialq.spec import FloatParam, StudySpec

SMALL_BUDGET = 100
"""Below this many trials, a study with trials in flight is small: joint models pay."""

AUTO_KEEPS_ARGS = frozenset({"seed"})
"""`sampler_args` that `auto` passes to GP too; any other key is TPE's, so TPE is built."""


LISTED_POINTS_MAX = 10**7
"""The most values of one stepped parameter a sampler that lists them all may meet: GP
holds each in an array at every ask (10**7: 3 s a study's first asks; 2**53 asked for
64 PiB) and the grid sampler lists them (issue 38, row 5)."""


def too_many_to_list(spec: StudySpec) -> str | None:
    """The first parameter of the spec's space with more values than a listing sampler
    holds, or None."""
    for name, param in spec.space.items():
        points = getattr(param, "points", None)
        if points is not None and points > LISTED_POINTS_MAX:
            return name
    return None


FEW_FLOATS = 2
"""At most this many parameters, every one a float: there GP alone, not taking turns with
TPE. On the eleven 2-D landscapes measured (issue 40: the suite's three, seven bbob functions
held out of it, the project's Branin; 50 trials, 16 in flight, 20 seeds) GP alone was better
beyond the seeds' noise on two and worse beyond it on none (Schaffer's F7 at the edge), where
TPE's turns spend half the trials on a model a parameter that a joint model of two beats; at
5-D those turns kept the search on rotated Rastrigin wide (docs/spec.md, "The default
sampler")."""


def few_floats(spec: StudySpec) -> bool:
    """Whether the spec's space is one or two floats and nothing else."""
    params = spec.space.values()
    return 0 < len(spec.space) <= FEW_FLOATS and all(isinstance(p, FloatParam) for p in params)


GP_NEEDS = ("torch", "scipy")
"""What Optuna's GP sampler imports at its first fit; trialq requires neither."""


def gp_runs_here() -> bool:
    """Whether Optuna's GP sampler can run here: its modules looked up, never imported."""
    return all(importlib.util.find_spec(module) is not None for module in GP_NEEDS)


def chosen_sampler(spec: StudySpec, gp_available: bool) -> str:
    """The sampler name `spec` builds: its own, or for `auto` `gp+tpe` (GP and independent
    TPE taking turns, `taking_turns`) on a small declared single-objective study with
    several trials in flight (where GP runs), `gp` alone there where the space is one or two
    floats (`FEW_FLOATS`), else `tpe`. `max_in_flight` unset means "the workers seen", taken
    as several."""
    study = spec.study
    if study.sampler != "auto":
        return study.sampler
    wide_and_short = study.max_in_flight != 1 and study.n_trials < SMALL_BUDGET
    modelled_by_gp = (
        len(study.objective_directions) == 1
        and study.search_space is None
        and bool(spec.space)
        and set(study.sampler_args) <= AUTO_KEEPS_ARGS
        and too_many_to_list(spec) is None
    )
    if not (gp_available and wide_and_short and modelled_by_gp):
        return "tpe"
    return "gp" if few_floats(spec) else "gp+tpe"
