"""Telling a sampler that a trial did not fit on the device (`[study] oom_as_constraint`).

Optuna's samplers never read FAIL trials: a trial that ran out of memory and is told FAIL
teaches the sampler nothing, and it proposes the same sizes again. Samplers that take
constraints learn "infeasible here" from a finished trial with a violated constraint, but
each reads different states: TPE reads PRUNED trials; NSGA-II reads only COMPLETE ones, so
there the trial needs objective values. Those values are stand-ins (the worst there is in
each direction): constrained domination ranks every infeasible trial below every feasible
one whatever its values, and Optuna's `best_trial` and `best_trials` skip infeasible trials.
trialq's own summary, status and report count such a trial as failed (its `outcome` attr
says `oom`) and never show its stand-in values: they read it through `trialq.oom_stand_ins`,
which the views may import as well as the driver.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from optuna.trial import TrialState

# Re-exported until trialq.driver.loop imports it from trialq.oom_stand_ins (issue 25).

OOM_CONSTRAINT = "oom"
"""The constraint's name; 1.0 on a trial that ran out of memory (feasible trials have none)."""


@dataclass(frozen=True)
class OomTelling:
    """The state (and values) an out-of-memory trial is told with, so a sampler learns."""

    state: TrialState
    values: list[float] | None


def oom_telling(sampler: str, directions: Sequence[str]) -> OomTelling | None:
    """How to tell an OOM trial to `sampler`; None for samplers that take no constraints."""
    if sampler == "tpe":
        return OomTelling(TrialState.PRUNED, None)
    if sampler == "nsga2":
        worst = [math.inf if d == "minimize" else -math.inf for d in directions]
        return OomTelling(TrialState.COMPLETE, worst)
    return None
