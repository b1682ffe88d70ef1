"""Reading a trial that ran out of memory, whatever state its sampler was told.

The driver tells an out-of-memory trial in the state its sampler reads (`[study]
oom_as_constraint`, `trialq.driver.sampling.oom_constraint`): PRUNED for TPE, COMPLETE with stand-in
values (the worst in each direction) for NSGA-II. Its `outcome` attr says `oom` all the
same, and trialq's own summary, status and report count such a trial as failed and never
show its stand-in values. The driver (its count of finished trials) and the views read it
here, so neither imports the other.
"""

from __future__ import annotations

from optuna.trial import FrozenTrial, TrialState

from trialq.wire.record import TrialRecord


def has_stand_in_values(trial: FrozenTrial) -> bool:
    """A COMPLETE trial whose values only stand in for an out-of-memory end."""
    return trial.state is TrialState.COMPLETE and _ran_out_of_memory(trial)


def counted_state(trial: FrozenTrial) -> TrialState:
    """The state a trial counts as in trialq's summaries: an OOM trial is a failure, whatever
    state the sampler was told."""
    return TrialState.FAIL if _ran_out_of_memory(trial) else trial.state


def real_values(trial: FrozenTrial) -> list[float] | None:
    """The trial's objective values, or None where they are stand-ins."""
    return None if has_stand_in_values(trial) else trial.values


def _ran_out_of_memory(trial: FrozenTrial) -> bool:
    outcome = TrialRecord.outcome_in(trial.user_attrs)
    return outcome is not None and outcome.teaches_a_constraint
