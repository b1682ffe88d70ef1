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

Optuna's GP sampler reads only COMPLETE trials, and a constraint only where every trial has
one, so it learns "bad here" from a value: the worst any trial really reached, a tenth of
the range beyond (a penalty it can model, where an infinite stand-in breaks its fit). Until
one trial has completed there is nothing to be worse than, and the trial is told PRUNED,
which GP skips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from optuna.samplers import BaseSampler, GPSampler, NSGAIISampler, TPESampler
from optuna.trial import TrialState

from trialq.driver.sampling.distinct import DistinctFromRunning
from trialq.driver.sampling.taking_turns import TakingTurns

# Re-exported until trialq.driver.loop imports it from trialq.oom_stand_ins.

OOM_CONSTRAINT = "oom"
"""The constraint's name; 1.0 on a trial that ran out of memory (feasible trials have none)."""


@dataclass(frozen=True)
class OomTelling:
    """The state (and values) an out-of-memory trial is told with, so a sampler learns."""

    state: TrialState
    values: list[float] | None
    constrained: bool = True
    """Whether the trial also carries the violated `oom` constraint (not for GP: it reads
    constraints only where every trial has them)."""


def sampler_kind(sampler: BaseSampler) -> str:
    """The name of the sampler that reads the study (through the driver's wrapper): `tpe`,
    `gp`, `nsga2`, or `other`. Samplers taking turns read it as GP where GP is one of them:
    GP needs an out-of-memory trial told COMPLETE with a penalty, which TPE reads too."""
    inner = sampler.sampler if isinstance(sampler, DistinctFromRunning) else sampler
    if isinstance(inner, TakingTurns):
        kinds = [sampler_kind(member) for member in inner.members]
        return "gp" if "gp" in kinds else kinds[0]
    known = {TPESampler: "tpe", GPSampler: "gp", NSGAIISampler: "nsga2"}
    return next((name for cls, name in known.items() if isinstance(inner, cls)), "other")


def oom_telling(
    sampler: str, directions: Sequence[str], seen: Sequence[Sequence[float]] = ()
) -> OomTelling | None:
    """How to tell an OOM trial to `sampler`; None for samplers that take no constraints.
    `seen`: the values of the trials that really completed (GP's penalty is taken from them)."""
    if sampler == "tpe":
        return OomTelling(TrialState.PRUNED, None)
    if sampler == "nsga2":
        worst = [math.inf if d == "minimize" else -math.inf for d in directions]
        return OomTelling(TrialState.COMPLETE, worst)
    if sampler == "gp":
        if not seen:
            return OomTelling(TrialState.PRUNED, None, constrained=False)
        return OomTelling(TrialState.COMPLETE, penalty(seen, directions), constrained=False)
    return None


def penalty(seen: Sequence[Sequence[float]], directions: Sequence[str]) -> list[float]:
    """Per objective, worse than every value in `seen` by a tenth of their range (of the
    value's size, or 1, where they are all equal), so it is never the best."""
    values = []
    for i, direction in enumerate(directions):
        column = [each[i] for each in seen]
        low, high = min(column), max(column)
        margin = 0.1 * (high - low) or 0.1 * abs(high) or 1.0
        values.append(high + margin if direction == "minimize" else low - margin)
    return values
