"""Which sampler `sampler = "auto"` (the default) builds: deciding only, nothing built here.

`auto` is Optuna's own default, `TPESampler(seed=...)` as the installed Optuna builds it
(Optuna 5: multivariate on one objective, independent on several, the constant liar, ten
random trials first), with nothing tuned by trialq: at every budget and every number of
trials in flight, so a 100-trial study's first 50 trials are drawn as a 50-trial study's
are. With trials in flight `make_sampler` puts it behind `DistinctFromRunning`, which only
ever redraws a proposal equal to a running trial's (where a parameter is continuous it never
does, and the study is the installed TPE's, trial for trial).

Why nothing of trialq's own: GP and TPE taking turns, a Halton start and a switch by
budget, tuned against Optuna 4's independent TPE, lost to the installed `TPESampler(seed)`
beyond noise on landscapes they were not tuned on (docs/spec.md, "The default sampler";
benchmarks/README.md, "Search quality with trials in flight", names the suite, seeds and
records). A candidate comes into `auto` only by beating it on the held-out part of the
suite (`benchmarks.coco_objectives.HELD_OUT`).
"""

from __future__ import annotations

import importlib.util

from trialq.spec import StudySpec

LISTED_POINTS_MAX = 10**7
"""The most values of one stepped parameter a sampler that lists them all may meet: GP
holds each in an array at every ask (10**7: 3 s a study's first asks; 2**53 asked for
64 PiB) and the grid sampler lists them."""


def too_many_to_list(spec: StudySpec) -> str | None:
    """The first parameter of the spec's space with more values than a listing sampler
    holds, or None."""
    for name, param in spec.space.items():
        points = getattr(param, "points", None)
        if points is not None and points > LISTED_POINTS_MAX:
            return name
    return None


GP_NEEDS = ("torch", "scipy")
"""What Optuna's GP sampler imports at its first fit; trialq requires neither."""


def gp_runs_here() -> bool:
    """Whether Optuna's GP sampler can run here: its modules looked up, never imported."""
    return all(importlib.util.find_spec(module) is not None for module in GP_NEEDS)


def chosen_sampler(spec: StudySpec) -> str:
    """The sampler name `spec` builds: its own, or for `auto` `tpe` (Optuna's default TPE),
    whatever the budget, the trials in flight or the space."""
    study = spec.study
    return "tpe" if study.sampler == "auto" else study.sampler
