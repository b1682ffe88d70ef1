"""A short `python -m benchmarks.parallel_search --suite coco` (issue 40): trialq's default
sampler at 16 trials in flight against Optuna's own default TPE at the same 16, on objectives
the project did not write, 50 trials.

It fails only on a clear regression: on some objective the default's median over the seeds
is worse than Optuna's TPE's worst seed. The studies are seeded (the same scores every run
with the same libraries), and the margin is wide: the figures with their intervals are the
benchmark's (benchmarks/README.md, "Objectives the project did not write").
"""

from __future__ import annotations

import statistics

import pytest

pytest.importorskip("cocoex")

from benchmarks.parallel_search import BASELINE, DEFAULT, Case, summarise

pytestmark = pytest.mark.slow

OBJECTIVES = ("cat-select", "cat-shift", "bbob-mixint-f15-d5")
"""Where the outside report saw the default lose most (a categorical that selects or moves a
landscape) and integers of COCO's mixint."""
SEEDS = range(3)
"""Few: GP proposes on all three (a study of 50 trials takes it about 5 s on an idle core)."""


def _scores(objective: str, variant: str) -> list[float]:
    cases = [Case(objective, variant, k=16, seed=seed, n_trials=50) for seed in SEEDS]
    return [summarise(case)["scores"]["50"] for case in cases]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_default_is_not_clearly_below_optuna_tpe_at_16_in_flight(objective: str) -> None:
    ours, theirs = _scores(objective, DEFAULT), _scores(objective, BASELINE)
    assert statistics.median(ours) <= max(theirs), (objective, sorted(ours), sorted(theirs))
