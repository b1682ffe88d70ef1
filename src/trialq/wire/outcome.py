"""How a trial ended (`Outcome`), and what each way of ending means, kept beside it.

What an outcome means is said once, in `Outcome.meaning`: the Optuna state it is told as,
whether the driver sends the trial again, what the search learns of it, and whether it
counts in a run of failures (`[study] max_failures_in_a_row`). Every reader asks it (as
Optuna's `TrialState.is_finished()`), so a member added without saying what it means fails
mypy (the match is exhaustive) and tests/unit/test_outcome.py, never silently becomes FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never


class Told(StrEnum):
    """The Optuna state an outcome is told as, by `optuna.trial.TrialState`'s name (the
    trial side never imports Optuna; the driver reads `TrialState[told]`)."""

    COMPLETE = "COMPLETE"
    PRUNED = "PRUNED"
    FAIL = "FAIL"


class Resent(StrEnum):
    """Whether the driver sends a trial that ended so again, and within which bound."""

    NEVER = "never"
    """Final: told as it is."""
    WITHIN_RETRIES = "within max_retries"
    """A lost worker's: sent again using a retry, told past `max_retries`."""
    WITHIN_RETRIES_IF_ASKED = "within max_retries with retry_crashes"
    """Final, unless `[trial] retry_crashes` makes it a retry."""
    WITHIN_PREEMPTIONS = "within max_preemptions"
    """Sent again, resuming from its checkpoint folder, told past `max_preemptions`."""
    USING_NO_RETRY = "using no retry"
    """Not the trial's doing: sent again, counting against no bound of the trial's."""


class Learnt(StrEnum):
    """What the search learns of a trial that ended so."""

    VALUES = "its values"
    PRUNED = "pruned at its last step"
    CONSTRAINT = "the params do not fit (oom_as_constraint)"
    """Told FAIL, or in the state the sampler reads with `[study] oom_as_constraint`."""
    FAILED = "the params failed"
    """A FAIL that says something of the params (they ran too long, or diverged)."""
    NOTHING = "nothing of the params"


@dataclass(frozen=True)
class Meaning:
    """What one outcome means to the driver, the search and whoever reads the study."""

    told: Told
    resent: Resent
    learnt: Learnt
    in_failure_streak: bool
    """Counts in `max_failures_in_a_row`: a failure that says nothing of the params, so
    the same one trial after trial means the run is broken, not the search."""


class Outcome(StrEnum):
    """How a trial ended. Only `ok` completes a trial; `worker_lost` is retried (up to
    `max_retries`) and `preempted` re-sent (up to `max_preemptions`): see `meaning`."""

    OK = "ok"
    PRUNED = "pruned"
    OOM = "oom"
    TIMEOUT = "timeout"
    ERROR = "error"
    WORKER_LOST = "worker_lost"
    STOPPED = "stopped"
    """Finished from outside while it ran (optuna-dashboard's Fail, the `optuna` CLI): the
    state told there stands, the process is killed, the trial is not retried."""
    PREEMPTED = "preempted"
    """The attempt was told to stop (its worker got SIGTERM: a spot node reclaimed) and saw
    it, or was killed after such a notice: the trial is re-sent, and resumes from what it
    saved in `trial.checkpoint_dir`. Final (FAIL) only past `max_preemptions`."""
    NOT_FINITE = "not_finite"
    """The trial returned, but an objective it returned is NaN or infinite (a diverged
    model): failed, as Optuna fails a NaN objective; the study goes on."""
    REFUSED = "refused"
    """The worker would not run it: its entrypoint is not allowed there, or does not import
    there. Not the trial's failure: it is sent again (elsewhere, or after a fix), and a run
    of refusals stops the run (`[study] max_failures_in_a_row`)."""
    CRASHED = "crashed"
    """The trial's process ended on its own (a signal such as SIGSEGV, `sys.exit`,
    `os._exit`) while its worker lived: the trial's own end, not a lost worker, so it is not
    retried unless `[trial] retry_crashes` says so."""
    GPU_GUARD = "gpu_guard"
    """Killed by trialq's GPU memory guard: NVML counted its processes past its budget plus
    the allowance for memory outside its framework's allocator (`TrialResult.gpu_guard`
    carries the figures). Never an `oom`: a kill is no OOM its code could catch, and what
    grew (a library beside the framework, or an allowance too small for it) is no fact of
    the params, so the sampler learns nothing and it counts in a run of failures
    (docs/oom.md, "A guard kill")."""

    @property
    def meaning(self) -> Meaning:
        """What this outcome means (docs/design.md, "What every finished trial records")."""
        match self:
            case Outcome.OK:
                return Meaning(Told.COMPLETE, Resent.NEVER, Learnt.VALUES, False)
            case Outcome.PRUNED:
                return Meaning(Told.PRUNED, Resent.NEVER, Learnt.PRUNED, False)
            case Outcome.OOM:
                return Meaning(Told.FAIL, Resent.NEVER, Learnt.CONSTRAINT, False)
            case Outcome.TIMEOUT | Outcome.NOT_FINITE:
                return Meaning(Told.FAIL, Resent.NEVER, Learnt.FAILED, False)
            case Outcome.ERROR | Outcome.GPU_GUARD:
                return Meaning(Told.FAIL, Resent.NEVER, Learnt.NOTHING, True)
            case Outcome.WORKER_LOST:
                return Meaning(Told.FAIL, Resent.WITHIN_RETRIES, Learnt.NOTHING, True)
            case Outcome.CRASHED:
                return Meaning(Told.FAIL, Resent.WITHIN_RETRIES_IF_ASKED, Learnt.NOTHING, True)
            case Outcome.REFUSED:
                return Meaning(Told.FAIL, Resent.USING_NO_RETRY, Learnt.NOTHING, True)
            case Outcome.PREEMPTED:
                return Meaning(Told.FAIL, Resent.WITHIN_PREEMPTIONS, Learnt.NOTHING, False)
            case Outcome.STOPPED:  # a person's: the state they told stands
                return Meaning(Told.FAIL, Resent.NEVER, Learnt.NOTHING, False)
            case _:
                assert_never(self)

    @property
    def told_as(self) -> Told:
        """The Optuna state the driver tells a trial that ended so."""
        return self.meaning.told

    @property
    def resent(self) -> Resent:
        """Whether the driver sends a trial that ended so again, and within which bound."""
        return self.meaning.resent

    @property
    def succeeded(self) -> bool:
        """Ended as trials do (completed or pruned), not as a failure."""
        return self.told_as is not Told.FAIL

    @property
    def in_failure_streak(self) -> bool:
        """Counts in a run of same failures (`[study] max_failures_in_a_row`)."""
        return self.meaning.in_failure_streak

    @property
    def teaches_a_constraint(self) -> bool:
        """Told in the state its sampler reads under `[study] oom_as_constraint`, its values
        then stand-ins (`trialq.oom_stand_ins`), and counted as failed whatever it was told."""
        return self.meaning.learnt is Learnt.CONSTRAINT

    @property
    def resumes(self) -> bool:
        """Its trial is sent again and resumes from what it saved (`checkpoint_dir`)."""
        return self.meaning.resent is Resent.WITHIN_PREEMPTIONS

    @classmethod
    def read(cls, text: object) -> Outcome | None:
        """The outcome a stored record names, or None (none recorded, or one this version
        does not know)."""
        try:
            return cls(text) if isinstance(text, str) else None
        except ValueError:
            return None
