"""What becomes of an attempt: one pure rule from what is known of it to one action.

The loop (`trialq.driver.loop`) gathers what the queue, the report channel and the storage
say of an attempt in flight into `Known`, asks `decide` for an `Action`, and applies that
action in one place. The action is the whole verdict: a `Tell` says the outcome, the state
and the values the trial is told with (its objective picked out, an out-of-memory trial told
as `oom_as_constraint` wants) and whether its process is killed first; a `Resend` whether
the old attempt is killed first. A trial finished from outside (`stopped_outside`) and a
trial a previous driver left running (`reattach`) are decided here too. Nothing here
touches Redis, the database or a clock, so the whole rule is tested as a table
(tests/unit/test_fate.py). Retries and preemptions are counted apart:
a lost worker uses a retry, a preemption uses a preemption, and a re-send that was not the
trial's doing (never started, withdrawn by the driver) uses neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import assert_never

from optuna.trial import TrialState

from trialq.driver.objective import objective_of
from trialq.driver.sampling.oom_constraint import OomTelling
from trialq.errors import SpecError
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.messages import Measurements, Outcome, TrialRequest, TrialResult
from trialq.wire.outcome import Resent

_RETRIED = (Resent.WITHIN_RETRIES, Resent.WITHIN_RETRIES_IF_ASKED)
"""A lost worker's and a crash's: a process gone without a result of its own."""

UNSEEN_CHECKS_TO_LOSE = 2
"""Checks in a row that find a task neither queued, reserved nor started before it counts
as lost in the broker (one check can race a worker's reservation)."""


@dataclass(frozen=True)
class Limits:
    """What the spec says of one trial's end: its bounds on re-sending it, and the metrics
    that are its objective (`study.metric`; None: the lone one it returns)."""

    max_retries: int
    max_preemptions: int
    memory_limit_mb: int = 0
    retry_crashes: bool = False
    objective_metrics: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Resends:
    """How often a trial was re-sent so far, each kind on its own."""

    retries: int = 0
    preemptions: int = 0


@dataclass(frozen=True)
class Known:
    """Everything the loop learnt of one attempt in flight in this pass."""

    request: TrialRequest
    status: TaskStatus
    resends: Resends = field(default_factory=Resends)
    worker_alive: bool = True
    """For a RUNNING attempt: whether its worker still beats."""
    queued: bool | None = None
    """For a WAITING attempt: whether the broker holds it; None when not checked this pass."""
    claim_lost: bool = False
    """For a WAITING attempt: a trial process claimed it (its beacon was seen) and has stopped
    beating with no start stored by Celery: its host was lost in between."""
    unseen_checks: int = 0
    """Checks in a row so far that found the task nowhere."""
    prune_overdue: bool = False
    """The pruner asked it to stop longer ago than `prune_grace_s`, and it runs on."""
    terminated: bool = False
    """The driver killed its process for not honouring a prune request."""
    oom_rss: int | None = None
    """The RSS at which the attempt killed itself for its memory limit, if it did."""
    stop_requested: bool = False
    """The attempt was told to stop (its worker's preemption notice)."""
    oom_telling: OomTelling | None = None
    """How the study tells a trial that ran out of memory so its sampler learns
    (`trialq.driver.sampling.oom_constraint`); None: told FAIL. Filled in only where the attempt may
    be told `oom` (`may_tell_oom`)."""


@dataclass(frozen=True)
class Tell:
    """The trial is over: tell Optuna this result, once, as `state` with `values`."""

    result: TrialResult
    """The result as told: its outcome is what the trial is recorded as."""
    state: TrialState = TrialState.FAIL
    values: list[float] | None = None
    """The objective values, for a COMPLETE trial only."""
    constrained: bool = False
    """The trial carries the violated `oom` constraint (`oom_as_constraint`)."""
    terminate: bool = False
    """Kill the attempt's process first: it may still run (its worker was given up on)."""
    ends_run: str | None = None
    """Why the run stops once the trial is told: the spec cannot say which metric is the
    objective, and every trial would fail the same way."""


@dataclass(frozen=True)
class Resend:
    """Send the same trial (number, params, checkpoint folder) again as a new attempt."""

    resends: Resends
    reason: str
    new_attempt: bool = True
    """False for an attempt that never started: it is sent again under its own number."""
    keep_artifacts: TrialResult | None = None
    """A cut-short attempt whose saved files stay linked to the trial."""
    refusal: str | None = None
    """Why the worker would not run it, for a trial its worker refused (`refused`)."""
    terminate: bool = False
    """Kill the old attempt's process first: it may still run (its worker was given up on)."""


@dataclass(frozen=True)
class Terminate:
    """Kill the attempt's process: it ignored the pruner past its grace."""


@dataclass(frozen=True)
class Wait:
    """Nothing to do yet; remember how many checks in a row found the task nowhere."""

    unseen_checks: int = 0


Action = Tell | Resend | Terminate | Wait


def decide(known: Known, limits: Limits) -> Action:
    """The one action for an attempt, from what is known of it: whether to tell it (and as
    what), re-send it, kill it, or wait."""
    action = _action(known, limits)
    if isinstance(action, Tell):
        action = _telling(action.result, known.oom_telling, limits)
    started = known.status.phase is TaskPhase.RUNNING or known.claim_lost
    if started and isinstance(action, Tell | Resend):
        return replace(action, terminate=True)  # given up on: its process may still run
    return action


def _action(known: Known, limits: Limits) -> Action:
    phase = known.status.phase
    if phase is TaskPhase.FINISHED:
        return _finished(known, limits)
    if phase is TaskPhase.FAILED:
        return _failed(known, limits)
    if phase is TaskPhase.RUNNING:
        return _running(known, limits)
    if phase is TaskPhase.WAITING:
        return _waiting(known, limits)
    assert_never(phase)


def _finished(known: Known, limits: Limits) -> Action:
    result = known.status.result
    assert result is not None, "a FINISHED status carries its result"
    if result.ran is not None and result.ran != known.request.what_ran():
        reason = "its result names other params or another entrypoint than were sent"
        return Resend(known.resends, reason, new_attempt=False, refusal=reason)
    if result.device_refused:  # it never ran: the worker's device was not clean
        return _lost(known, limits, result.error or "the worker's device was not clean")
    if result.outcome is Outcome.WORKER_LOST:  # its driver could not answer it (a suggest)
        return _lost(known, limits, result.error or "its driver did not answer")
    if result.outcome.resent is Resent.WITHIN_PREEMPTIONS:
        return _preempted(known, limits, result)
    if result.outcome is Outcome.OOM and result.oom_caused_by_neighbour:
        return _crowded_out(known, limits, result)
    if result.outcome.resent is Resent.USING_NO_RETRY:  # another worker may take it (refused)
        reason = result.error or "refused by its worker"
        return Resend(known.resends, reason, new_attempt=False, refusal=reason)
    return Tell(result)


def _failed(known: Known, limits: Limits) -> Action:
    """The process ended without a result: killed, out of time, or stopped by the driver."""
    status = known.status
    if known.terminated:
        note = "stopped from outside: the trial did not honour should_prune() in time"
        return Tell(synthetic(known.request, Outcome.PRUNED, note))
    if status.withdrawn:  # a driver took it back before it ran (interrupted, say)
        return Resend(known.resends, "withdrawn before it ran", new_attempt=False)
    resent = status.failure.resent if status.failure is not None else Resent.NEVER
    if resent is Resent.WITHIN_RETRIES:  # its worker was lost
        return _lost(known, limits, status.detail)
    if resent is Resent.WITHIN_RETRIES_IF_ASKED:  # it crashed
        return _crashed(known, limits, status.detail)
    return Tell(synthetic(known.request, status.failure or Outcome.ERROR, status.detail))


def _running(known: Known, limits: Limits) -> Action:
    if known.prune_overdue and not known.terminated:
        return Terminate()
    if not known.worker_alive:
        return _lost(known, limits, f"worker {known.status.worker} stopped beating")
    return Wait()


def _waiting(known: Known, limits: Limits) -> Action:
    if known.claim_lost:  # Celery will not say: its message waits out the visibility timeout
        return _lost(known, limits, "its trial process stopped beating before it started")
    if known.queued is None or known.queued:
        return Wait(0 if known.queued else known.unseen_checks)
    unseen = known.unseen_checks + 1
    if unseen < UNSEEN_CHECKS_TO_LOSE:
        return Wait(unseen)
    return Resend(known.resends, "lost in the broker before it started", new_attempt=False)


def _lost(known: Known, limits: Limits, detail: str) -> Action:
    """The attempt's process is gone without a result of its own. A process that killed
    itself over `memory_limit_mb` ran out of memory; one lost after its stop notice was
    preempted; anything else was its worker's loss, retried up to `max_retries`."""
    if known.oom_rss is not None:
        limit = f"memory_limit_mb = {limits.memory_limit_mb}"
        over = f"killed at {_mib(known.oom_rss)} RSS, over {limit}"
        result = synthetic(known.request, Outcome.OOM, over)
        return Tell(result.measured_also(Measurements(peak_rss_bytes=known.oom_rss)))
    if known.stop_requested:
        note = f"killed after its stop notice ({detail})"
        return _preempted(known, limits, synthetic(known.request, Outcome.PREEMPTED, note))
    if known.resends.retries < limits.max_retries:
        resends = replace(known.resends, retries=known.resends.retries + 1)
        return Resend(resends, f"retried after: {detail}")
    return Tell(synthetic(known.request, Outcome.WORKER_LOST, detail))


def _crashed(known: Known, limits: Limits, detail: str) -> Action:
    """The trial's process ended on its own while its worker lived: the trial's end, unless
    it was its memory guard's kill or its preemption, or the spec retries crashes."""
    if known.oom_rss is not None or known.stop_requested:
        return _lost(known, limits, detail)
    if limits.retry_crashes and known.resends.retries < limits.max_retries:
        return _lost(known, limits, detail)
    return Tell(synthetic(known.request, Outcome.CRASHED, detail))


def _preempted(known: Known, limits: Limits, result: TrialResult) -> Action:
    """Re-send a preempted trial, or fail it past `max_preemptions`."""
    if known.resends.preemptions < limits.max_preemptions:
        resends = replace(known.resends, preemptions=known.resends.preemptions + 1)
        reason = f"re-sent after preemption: {result.error or ''}"
        return Resend(resends, reason, keep_artifacts=result)
    given_up = f"gave up after {known.resends.preemptions} preemptions"
    return Tell(result.with_error(f"{result.error or 'preempted'}; {given_up}"))


def _crowded_out(known: Known, limits: Limits, result: TrialResult) -> Action:
    """Out of memory on a GPU its neighbours filled while it kept within its budget: not the
    trial's doing, so re-sent using no retry (counted with the preemptions, bounded by
    `max_preemptions`); past that, told `error`, never `oom`, which teaches a sampler
    (`oom_as_constraint`) that the params do not fit."""
    if known.resends.preemptions < limits.max_preemptions:
        resends = replace(known.resends, preemptions=known.resends.preemptions + 1)
        return Resend(resends, f"re-sent: a neighbour's out of memory: {result.error or ''}")
    given_up = f"out of memory caused by neighbours, {known.resends.preemptions} times"
    return Tell(result.failed_as(Outcome.ERROR, f"{given_up}: {result.error or ''}"))


def _telling(result: TrialResult, oom: OomTelling | None, limits: Limits) -> Tell:
    """How a result is told: an `ok` result's objective picked out (a missing or non-finite
    one fails the trial), an out-of-memory one as `oom_as_constraint` says."""
    try:
        result, values = objective_of(result, limits.objective_metrics)
    except SpecError as exc:
        return Tell(result.failed_as(Outcome.ERROR, str(exc)), ends_run=str(exc))
    if result.outcome.teaches_a_constraint and oom is not None:
        # A FAIL trial teaches no sampler anything; see trialq.driver.sampling.oom_constraint.
        return _complete_only(Tell(result, oom.state, oom.values, oom.constrained))
    return _complete_only(Tell(result, told_state(result.outcome), values))


def _complete_only(tell: Tell) -> Tell:
    """Optuna takes values with a COMPLETE trial only."""
    return tell if tell.state is TrialState.COMPLETE else replace(tell, values=None)


def told_state(outcome: Outcome) -> TrialState:
    """The state a trial with this outcome is told as (before `oom_as_constraint`)."""
    return TrialState[outcome.told_as]


def may_tell_oom(status: TaskStatus, oom_rss: int | None) -> bool:
    """Whether the attempt may be told `oom`: only then is the study asked how
    (`Known.oom_telling`: it reads every completed trial)."""
    if oom_rss is not None:
        return True
    result = status.result
    return (
        status.phase is TaskPhase.FINISHED
        and result is not None
        and result.outcome.teaches_a_constraint
        and not result.oom_caused_by_neighbour
    )


@dataclass(frozen=True)
class Stopped:
    """Someone else finished the trial while it ran (optuna-dashboard's Fail button): their
    state stands; kill its process and record it as `stopped`, never retried."""

    note: str
    counted_as: TrialState
    outcome: Outcome = Outcome.STOPPED


def stopped_outside(state: TrialState, counted_as: TrialState) -> Stopped:
    """The verdict on an attempt in flight whose trial was finished elsewhere as `state`
    (`counted_as`: how the run counts it, `trialq.oom_stand_ins.counted_state`)."""
    note = f"finished from outside as {state.name} while it ran; its process was killed"
    return Stopped(note, counted_as)


@dataclass(frozen=True)
class Abandon:
    """A trial a previous driver asked and never sent: fail it with a note (a fresh trial
    takes its place)."""

    note: str = "never sent: the previous driver stopped between asking and sending it"


@dataclass(frozen=True)
class SendAgain:
    """A trial a previous driver recorded before it sent it (an older driver recorded ids
    only after sending): send it, as the same attempt."""


@dataclass(frozen=True)
class Follow:
    """A trial a previous driver sent: follow its task as one in flight."""


def reattach(task_id: str | None, has_params: bool) -> Abandon | SendAgain | Follow:
    """What becomes of a trial a previous driver left RUNNING. A trial is persisted with its
    params and task id in one transaction before it is sent, so one with neither was asked
    and never sent."""
    if task_id is not None:
        return Follow()
    return SendAgain() if has_params else Abandon()


def synthetic(request: TrialRequest, outcome: Outcome, detail: str) -> TrialResult:
    """The result of an attempt whose process returned none of its own."""
    return TrialResult.of(request, outcome, detail)


def _mib(n_bytes: int) -> str:
    """`612 MiB`, or `2.5 GiB` past 10 GiB: what a person reads, not a count of bytes."""
    mib = n_bytes / 2**20
    return f"{mib / 1024:.1f} GiB" if mib >= 10 * 1024 else f"{mib:.0f} MiB"


def may_be_lost(status: TaskStatus, worker_alive: bool, claim_lost: bool = False) -> bool:
    """Whether the attempt's process may be gone without a result of its own: only then does
    the report channel's word on it (a memory kill, a stop notice) change the rule's answer."""
    if claim_lost:
        return True
    if status.phase is TaskPhase.FINISHED:
        return status.result is not None and status.result.device_refused
    if status.phase is TaskPhase.FAILED:
        failure = status.failure
        return failure is not None and failure.resent in _RETRIED
    return status.phase is TaskPhase.RUNNING and not worker_alive
