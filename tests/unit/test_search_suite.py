"""A short `python -m benchmarks.parallel_search --suite heldout`: trialq's default sampler at
16 trials in flight against the baseline (the installed Optuna's `TPESampler(seed)`) at the
same 16, on objectives of the held-out part (never tuned on), 50 trials, a few seeds.

It fails when the default falls behind beyond noise: the 90% bootstrap interval of the
per-seed differences (default minus baseline, lower is better) lies wholly above 0, the
benchmark's own test (`versus_optuna`). The studies are seeded: the same scores every run
with the same libraries. The full figures: benchmarks/README.md, "Search quality with
trials in flight".
"""

from __future__ import annotations

import pytest

pytest.importorskip("cocoex")

from benchmarks.coco_objectives import HELD_OUT
from benchmarks.parallel_search import BASELINE, DEFAULT, Case, paired_cell, summarise

pytestmark = pytest.mark.slow

OBJECTIVES = ("bbob-mixint-f20-d5", "cat-raw", "log-int", "bbob-f12-d5")
"""Integers with a float (COCO's mixint Schwefel), a categorical that picks the landscape,
log-scale floats and ints, and bent cigar (where the rule `auto` had lost beyond noise)."""
SEEDS = range(4)


def _scores(objective: str, variant: str) -> list[float]:
    cases = [Case(objective, variant, k=16, seed=seed, n_trials=50) for seed in SEEDS]
    return [summarise(case)["scores"]["50"] for case in cases]


def test_the_objectives_are_held_out() -> None:
    assert set(OBJECTIVES) <= set(HELD_OUT)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_default_is_not_behind_optunas_default_tpe_at_16_in_flight(objective: str) -> None:
    cell = paired_cell(_scores(objective, DEFAULT), _scores(objective, BASELINE))
    assert cell["p05"] <= 0, (objective, cell)
