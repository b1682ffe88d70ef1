"""The fate rule as a table: what is known of an attempt -> the one action the driver takes.

No database, no Redis: `trialq.driver.fate.decide` is pure, so every row is a value in and a
value out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from optuna.trial import TrialState
from trial_requests import trial_request

from trialq.driver.fate import (
    Abandon,
    Follow,
    Known,
    Limits,
    Resend,
    Resends,
    SendAgain,
    Tell,
    Terminate,
    Wait,
    decide,
    may_be_lost,
    may_tell_oom,
    reattach,
    stopped_outside,
)
from trialq.driver.sampling.oom_constraint import OomTelling
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.messages import GpuGuardFigures, Outcome, TrialResult

LIMITS = Limits(max_retries=2, max_preemptions=3, memory_limit_mb=512)
REQUEST = trial_request(number=7, params={"x": 0.5})


def _result(outcome: Outcome, **fields: Any) -> TrialResult:
    return TrialResult(study="s", number=7, attempt=1, outcome=outcome, **fields)


def _known(phase: TaskPhase, **fields: Any) -> Known:
    status = TaskStatus(
        phase,
        result=fields.pop("result", None),
        failure=fields.pop("failure", None),
        detail=fields.pop("detail", ""),
        worker=fields.pop("worker", None),
        withdrawn=fields.pop("withdrawn", False),
    )
    return Known(request=REQUEST, status=status, **fields)


FINISHED = TaskPhase.FINISHED
FAILED = TaskPhase.FAILED
RUNNING = TaskPhase.RUNNING
WAITING = TaskPhase.WAITING
LOST = Outcome.WORKER_LOST
USED_UP = Resends(retries=2)
PREEMPTED_OUT = Resends(preemptions=3)
CROWDED_OUT = _result(Outcome.OOM, oom_caused_by_neighbour=True)
OK = _result(Outcome.OK, metrics={"value": 0.5})
VALUE = {"metrics": {"value": 0.5}}

# (case, known, expected action type, expected outcome told or resends after)
TABLE: list[tuple[str, Known, type, Any]] = [
    ("ok result is told", _known(FINISHED, result=OK), Tell, Outcome.OK),
    ("error result is told", _known(FINISHED, result=_result(Outcome.ERROR)), Tell, Outcome.ERROR),
    ("oom result is told", _known(FINISHED, result=_result(Outcome.OOM)), Tell, Outcome.OOM),
    (
        "pruned result is told",
        _known(FINISHED, result=_result(Outcome.PRUNED)),
        Tell,
        Outcome.PRUNED,
    ),
    (
        "device refused: a retry",
        _known(FINISHED, result=_result(Outcome.ERROR, device_refused=True)),
        Resend,
        Resends(retries=1),
    ),
    (
        "device refused, retries used up: worker_lost",
        _known(FINISHED, result=_result(Outcome.ERROR, device_refused=True), resends=USED_UP),
        Tell,
        LOST,
    ),
    (
        "refused by its worker: re-sent, no retry used",
        _known(FINISHED, result=_result(Outcome.REFUSED, error="not allowed"), resends=USED_UP),
        Resend,
        USED_UP,
    ),
    (
        "a result of the request sent is told",
        _known(FINISHED, result=TrialResult.of(REQUEST, Outcome.OK).model_copy(update=VALUE)),
        Tell,
        Outcome.OK,
    ),
    (
        "a result of other params than sent: never told, re-sent, no retry used",
        _known(FINISHED, result=_result(Outcome.OK, metrics={"value": 9.0}, ran="0" * 64)),
        Resend,
        Resends(),
    ),
    (
        "oom caused by a neighbour: re-sent, no retry used",
        _known(FINISHED, result=CROWDED_OUT, resends=USED_UP),
        Resend,
        Resends(retries=2, preemptions=1),
    ),
    (
        "oom caused by neighbours past max_preemptions: error, never oom",
        _known(FINISHED, result=CROWDED_OUT, resends=PREEMPTED_OUT),
        Tell,
        Outcome.ERROR,
    ),
    (
        "preempted: a preemption, not a retry",
        _known(FINISHED, result=_result(Outcome.PREEMPTED)),
        Resend,
        Resends(preemptions=1),
    ),
    (
        "preempted past max_preemptions: told",
        _known(FINISHED, result=_result(Outcome.PREEMPTED), resends=PREEMPTED_OUT),
        Tell,
        Outcome.PREEMPTED,
    ),
    (
        "preempted with retries used up: still re-sent",
        _known(FINISHED, result=_result(Outcome.PREEMPTED), resends=USED_UP),
        Resend,
        Resends(retries=2, preemptions=1),
    ),
    (
        "worker lost: a retry",
        _known(FAILED, failure=LOST, detail="SIGKILL"),
        Resend,
        Resends(retries=1),
    ),
    (
        "worker lost, retries used up: told worker_lost",
        _known(FAILED, failure=LOST, resends=USED_UP),
        Tell,
        LOST,
    ),
    (
        "lost over its memory limit: oom, no retry",
        _known(FAILED, failure=LOST, oom_rss=600 << 20),
        Tell,
        Outcome.OOM,
    ),
    (
        "lost after its stop notice: preempted",
        _known(FAILED, failure=LOST, stop_requested=True),
        Resend,
        Resends(preemptions=1),
    ),
    (
        "lost after stop notice, preemptions used up",
        _known(FAILED, failure=LOST, stop_requested=True, resends=PREEMPTED_OUT),
        Tell,
        Outcome.PREEMPTED,
    ),
    (
        "crashed (SIGSEGV, sys.exit), worker alive: told crashed, no retry",
        _known(FAILED, failure=Outcome.CRASHED, detail="signal 11 (SIGSEGV)"),
        Tell,
        Outcome.CRASHED,
    ),
    (
        "crashed with retry_crashes: a retry",
        _known(FAILED, failure=Outcome.CRASHED),
        Resend,
        Resends(retries=1),
    ),
    (
        "crashed with retry_crashes, retries used up",
        _known(FAILED, failure=Outcome.CRASHED, resends=USED_UP),
        Tell,
        Outcome.CRASHED,
    ),
    (
        "crashed over its memory limit: oom",
        _known(FAILED, failure=Outcome.CRASHED, oom_rss=1),
        Tell,
        Outcome.OOM,
    ),
    (
        "crashed after its stop notice: preempted",
        _known(FAILED, failure=Outcome.CRASHED, stop_requested=True),
        Resend,
        Resends(preemptions=1),
    ),
    (
        "withdrawn by a driver before it ran: re-sent, no retry used",
        _known(FAILED, withdrawn=True, resends=USED_UP),
        Resend,
        USED_UP,
    ),
    ("timed out: told timeout", _known(FAILED, failure=Outcome.TIMEOUT), Tell, Outcome.TIMEOUT),
    ("failed with no word: told error", _known(FAILED), Tell, Outcome.ERROR),
    (
        "killed for ignoring the pruner: pruned",
        _known(FAILED, failure=LOST, terminated=True),
        Tell,
        Outcome.PRUNED,
    ),
    ("running, worker beats: wait", _known(RUNNING, worker="w1"), Wait, 0),
    (
        "running, worker silent: a retry",
        _known(RUNNING, worker="w1", worker_alive=False),
        Resend,
        Resends(retries=1),
    ),
    (
        "running, worker silent, over memory: oom",
        _known(RUNNING, worker="w1", worker_alive=False, oom_rss=1),
        Tell,
        Outcome.OOM,
    ),
    (
        "running past the prune grace: terminate",
        _known(RUNNING, prune_overdue=True),
        Terminate,
        None,
    ),
    (
        "already terminated: wait for its end",
        _known(RUNNING, prune_overdue=True, terminated=True),
        Wait,
        0,
    ),
    ("waiting, not checked: keep the count", _known(WAITING, unseen_checks=1), Wait, 1),
    ("waiting, queued: count reset", _known(WAITING, queued=True, unseen_checks=1), Wait, 0),
    ("waiting, unseen once: count it", _known(WAITING, queued=False), Wait, 1),
    (
        "waiting, unseen twice: re-sent, no retry used",
        _known(WAITING, queued=False, unseen_checks=1),
        Resend,
        Resends(),
    ),
    (
        "waiting, claimed and its beacon gone (host lost before STARTED): a retry",
        _known(WAITING, queued=True, claim_lost=True),
        Resend,
        Resends(retries=1),
    ),
    (
        "waiting, claimed and its beacon gone, retries used up: worker_lost",
        _known(WAITING, queued=True, claim_lost=True, resends=USED_UP),
        Tell,
        LOST,
    ),
    (
        "waiting, claimed and gone after its stop notice: preempted",
        _known(WAITING, queued=True, claim_lost=True, stop_requested=True),
        Resend,
        Resends(preemptions=1),
    ),
]


@pytest.mark.parametrize(
    ("known", "kind", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_the_fate_rule(
    request: pytest.FixtureRequest, known: Known, kind: type, expected: Any
) -> None:
    retry_crashes = "retry_crashes" in request.node.callspec.id
    action = decide(known, replace(LIMITS, retry_crashes=retry_crashes))

    assert type(action) is kind
    if isinstance(action, Tell):
        assert action.result.outcome is expected
        assert (action.result.number, action.result.attempt) == (7, 1)
    elif isinstance(action, Resend):
        assert action.resends == expected
    elif isinstance(action, Wait):
        assert action.unseen_checks == expected


def test_a_never_started_attempt_is_sent_under_its_own_number_others_under_the_next() -> None:
    unseen = decide(_known(WAITING, queued=False, unseen_checks=1), LIMITS)
    lost = decide(_known(FAILED, failure=LOST), LIMITS)

    assert isinstance(unseen, Resend) and not unseen.new_attempt
    assert isinstance(lost, Resend) and lost.new_attempt


def test_an_attempt_lost_before_celery_stored_its_start_is_sent_as_a_new_attempt() -> None:
    lost = decide(_known(WAITING, queued=True, claim_lost=True), LIMITS)

    assert isinstance(lost, Resend) and lost.new_attempt
    assert "stopped beating before it started" in lost.reason


def test_a_preempted_attempts_files_stay_linked_and_the_give_up_says_why() -> None:
    result = _result(Outcome.PREEMPTED, error="SIGTERM")
    resent = decide(_known(FINISHED, result=result), LIMITS)
    told = decide(_known(FINISHED, result=result, resends=PREEMPTED_OUT), LIMITS)

    assert isinstance(resent, Resend) and resent.keep_artifacts == result
    assert isinstance(told, Tell) and told.result.error == "SIGTERM; gave up after 3 preemptions"


def test_an_oom_kill_records_the_rss_it_died_at() -> None:
    told = decide(_known(FAILED, failure=LOST, oom_rss=600 << 20), LIMITS)

    assert isinstance(told, Tell)
    assert told.result.peak_rss_bytes == 600 << 20
    assert "memory_limit_mb = 512" in (told.result.error or "")


def test_retries_and_preemptions_count_apart() -> None:
    once_each = replace(_known(FAILED, failure=LOST), resends=Resends(retries=1, preemptions=3))

    action = decide(once_each, LIMITS)

    assert isinstance(action, Resend) and action.resends == Resends(retries=2, preemptions=3)


@pytest.mark.parametrize(
    ("status", "alive", "expected"),
    [
        (TaskStatus(FINISHED, result=_result(Outcome.OK)), True, False),
        (TaskStatus(FINISHED, result=_result(Outcome.ERROR, device_refused=True)), True, True),
        (TaskStatus(FAILED, failure=LOST), True, True),
        (TaskStatus(FAILED, failure=Outcome.TIMEOUT), True, False),
        (TaskStatus(RUNNING, worker="w"), True, False),
        (TaskStatus(RUNNING, worker="w"), False, True),
        (TaskStatus(WAITING), True, False),
    ],
)
def test_the_channel_is_asked_only_when_an_attempt_may_be_lost(
    status: TaskStatus, alive: bool, expected: bool
) -> None:
    assert may_be_lost(status, alive) is expected


def test_the_channel_is_asked_of_a_waiting_attempt_whose_claim_was_lost() -> None:
    assert may_be_lost(TaskStatus(WAITING), True, claim_lost=True)


COMPLETE, PRUNED, FAIL = TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL
TPE_OOM = OomTelling(TrialState.PRUNED, None)
GP_OOM = OomTelling(TrialState.COMPLETE, [9.0], constrained=False)
OOM = _result(Outcome.OOM, metrics={"value": 0.5})
GUARD_KILL = _result(
    Outcome.GPU_GUARD,
    gpu_guard=GpuGuardFigures(
        device="0", own_bytes=11 << 30, reserved_bytes=7 << 30, allowance_bytes=2 << 30,
        budget_bytes=8 << 30,
    ),
)  # fmt: skip

# (case, known, outcome told, state told, values told, constrained)
TELLING: list[tuple[str, Known, Outcome, TrialState, Any, bool]] = [
    ("ok: complete with its value", _known(FINISHED, result=OK), Outcome.OK, COMPLETE, [0.5], False),
    (
        "ok, objective not finite: not_finite, failed",
        _known(FINISHED, result=_result(Outcome.OK, metrics={"value": float("nan")})),
        Outcome.NOT_FINITE, FAIL, None, False,
    ),
    (
        "pruned: pruned, no values",
        _known(FINISHED, result=_result(Outcome.PRUNED, metrics={"value": 0.5})),
        Outcome.PRUNED, PRUNED, None, False,
    ),
    ("oom, no oom_as_constraint: failed", _known(FINISHED, result=OOM), Outcome.OOM, FAIL, None, False),
    (
        "oom to TPE: pruned with the constraint",
        _known(FINISHED, result=OOM, oom_telling=TPE_OOM),
        Outcome.OOM, PRUNED, None, True,
    ),
    (
        "oom to GP: complete with its penalty, no constraint",
        _known(FINISHED, result=OOM, oom_telling=GP_OOM),
        Outcome.OOM, COMPLETE, [9.0], False,
    ),
    (
        "memory kill to TPE: pruned with the constraint",
        _known(FAILED, failure=LOST, oom_rss=1, oom_telling=TPE_OOM),
        Outcome.OOM, PRUNED, None, True,
    ),
    (
        "a GPU guard kill to TPE: gpu_guard, failed, never the oom constraint",
        _known(FINISHED, result=GUARD_KILL, oom_telling=TPE_OOM),
        Outcome.GPU_GUARD, FAIL, None, False,
    ),
    (
        "crowded out past max_preemptions, oom_as_constraint: error, failed",
        _known(FINISHED, result=CROWDED_OUT, resends=PREEMPTED_OUT, oom_telling=TPE_OOM),
        Outcome.ERROR, FAIL, None, False,
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("known", "outcome", "state", "values", "constrained"),
    [row[1:] for row in TELLING],
    ids=[row[0] for row in TELLING],
)
def test_what_a_trial_is_told_as(
    known: Known, outcome: Outcome, state: TrialState, values: Any, constrained: bool
) -> None:
    told = decide(known, LIMITS)

    assert isinstance(told, Tell)
    assert (told.result.outcome, told.state, told.values, told.constrained) == (
        outcome, state, values, constrained,
    )  # fmt: skip
    assert told.ends_run is None


def test_a_named_metric_missing_fails_the_trial_as_error() -> None:
    loss_only = _result(Outcome.OK, metrics={"loss": 0.1})
    told = decide(_known(FINISHED, result=loss_only), replace(LIMITS, objective_metrics=("acc",)))

    assert isinstance(told, Tell) and (told.result.outcome, told.state) == (Outcome.ERROR, FAIL)
    assert told.values is None and told.ends_run is None
    assert told.result.error == "metric acc not returned (got loss)"


def test_a_spec_that_cannot_pick_the_objective_fails_the_trial_and_ends_the_run() -> None:
    several = _result(Outcome.OK, metrics={"acc": 0.9, "loss": 0.1})

    told = decide(_known(FINISHED, result=several), LIMITS)

    assert isinstance(told, Tell) and (told.result.outcome, told.state) == (Outcome.ERROR, FAIL)
    assert told.ends_run is not None and "set study.metric" in told.ends_run
    assert told.result.error == told.ends_run


@pytest.mark.parametrize(
    ("known", "terminate"),
    [
        (_known(RUNNING, worker_alive=False), True),
        (_known(RUNNING, worker_alive=False, resends=USED_UP), True),
        (_known(WAITING, queued=True, claim_lost=True), True),
        (_known(FAILED, failure=LOST), False),
        (_known(FINISHED, result=OK), False),
        (_known(WAITING, queued=False, unseen_checks=1), False),
    ],
)
def test_an_attempt_given_up_on_while_it_may_run_is_killed_first(
    known: Known, terminate: bool
) -> None:
    action = decide(known, LIMITS)

    assert isinstance(action, Tell | Resend) and action.terminate is terminate


@pytest.mark.parametrize(
    ("status", "oom_rss", "expected"),
    [
        (TaskStatus(FINISHED, result=OOM), None, True),
        (TaskStatus(FINISHED, result=CROWDED_OUT), None, False),
        (TaskStatus(FINISHED, result=OK), None, False),
        (TaskStatus(FAILED, failure=LOST), 1, True),
        (TaskStatus(FAILED, failure=LOST), None, False),
    ],
)
def test_the_study_is_asked_how_to_tell_an_oom_only_where_one_may_be_told(
    status: TaskStatus, oom_rss: int | None, expected: bool
) -> None:
    assert may_tell_oom(status, oom_rss) is expected


def test_a_trial_finished_from_outside_is_stopped_and_counted_as_its_state() -> None:
    stopped = stopped_outside(TrialState.FAIL, counted_as=TrialState.FAIL)

    assert stopped.outcome is Outcome.STOPPED and stopped.counted_as is TrialState.FAIL
    assert stopped.note == "finished from outside as FAIL while it ran; its process was killed"


@pytest.mark.parametrize(
    ("task_id", "has_params", "expected"),
    [("t1", True, Follow), ("t1", False, Follow), (None, True, SendAgain), (None, False, Abandon)],
)
def test_a_trial_left_running_by_a_previous_driver(
    task_id: str | None, has_params: bool, expected: type
) -> None:
    assert type(reattach(task_id, has_params)) is expected


def test_a_guard_kill_is_never_asked_how_to_tell_an_oom() -> None:
    """`oom_as_constraint` is asked only for an attempt that may be told `oom`."""
    assert not may_tell_oom(TaskStatus(FINISHED, result=GUARD_KILL), None)
    assert may_tell_oom(TaskStatus(FINISHED, result=OOM), None)
    told = decide(_known(FINISHED, result=GUARD_KILL), LIMITS)
    assert isinstance(told, Tell) and told.result.gpu_guard == GUARD_KILL.gpu_guard
