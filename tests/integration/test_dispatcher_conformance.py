"""One set of promises for every `Dispatcher` (trialq.wire.dispatch): Celery's, against real
worker processes and the real Redis, and the in-process stand-in that the driver's loop tests
use (tests/stand_in.py). What the loop tests learn from the stand-in holds for a real run only
as far as the two keep the same promises; these assertions are those promises."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from stand_in import StandInDispatcher
from trial_requests import trial_request
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.wire.channel import TrialAddress
from trialq.wire.dispatch import Dispatcher, TaskPhase, TaskStatus
from trialq.wire.messages import Outcome, TrialRequest

pytestmark = pytest.mark.integration

X = 0.5
CURVE = [X * (step + 1) for step in range(10)]
"""What `trials:reports_curve` reports for x = 0.5, step by step; it returns x * 10."""
PHASES = [TaskPhase.WAITING, TaskPhase.RUNNING, TaskPhase.FINISHED]


@dataclass
class Subject:
    dispatcher: Dispatcher
    queue: str
    idle_queue: str
    """A queue no worker consumes: what is sent there waits until withdrawn."""


def _curve_request(number: int) -> TrialRequest:
    return trial_request(study="conformance", number=number, params={"x": X},
                         entrypoint="trials:reports_curve", hard_limit_s=120)  # fmt: skip


@pytest.fixture(params=["celery", "stand_in"])
def subject(
    request: pytest.FixtureRequest, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> Iterator[Subject]:
    if request.param == "celery":
        start_workers(1, queue="gpu")
        yield Subject(CeleryDispatcher(Settings(broker_url=redis_url)), "gpu", "idle")
        return
    # The stand-in plays back a script, one entry per submitted attempt, in order.
    script: list[dict[str, object]] = [
        {"reports": CURVE, "outcome": Outcome.OK, "metrics": {"value": X * 10}},
        {"outcome": Outcome.OK, "metrics": {"value": 1.0}},
    ]
    yield Subject(StandInDispatcher(script), "gpu", "idle")


def _until_finished(dispatcher: Dispatcher, task_id: str) -> list[TaskStatus]:
    """Every status read until the task finished, in order."""
    seen: list[TaskStatus] = []

    def finished() -> bool:
        seen.append(dispatcher.statuses([task_id])[task_id])
        return seen[-1].phase in (TaskPhase.FINISHED, TaskPhase.FAILED)

    wait_until(finished, 90, lambda: f"{task_id} to finish (last {seen[-1:]})")
    return seen


def test_a_trial_is_sent_under_its_id_runs_and_reports_its_curve(subject: Subject) -> None:
    dispatcher = subject.dispatcher
    request = _curve_request(number=7)
    task_id = str(uuid.uuid4())

    assert dispatcher.submit(request, subject.queue, task_id=task_id) == task_id

    seen = _until_finished(dispatcher, task_id)
    phases = [status.phase for status in seen]
    assert phases[-1] is TaskPhase.FINISHED, seen[-1]
    assert all(a in PHASES for a in phases), phases
    assert [PHASES.index(a) for a in phases] == sorted(PHASES.index(a) for a in phases), phases
    result = seen[-1].result
    assert result is not None and result.outcome is Outcome.OK, result
    assert (result.study, result.number, result.attempt) == ("conformance", 7, 1)
    assert result.metrics == {"value": X * 10}

    reports = dispatcher.reports()
    assert reports is not None, "both dispatchers carry a report channel"
    address = TrialAddress("conformance", 7, 1)
    read = reports.read_new({address: "0"})
    assert [(r.step, r.value) for r in read[address]] == list(enumerate(CURVE))
    assert reports.read_new({address: read[address][-1].stream_id}) == {}, "nothing new"
    reports.forget(address)
    assert reports.read_new({address: "0"}) == {}, "forgotten once told"


def test_statuses_answer_for_every_id_asked(subject: Subject) -> None:
    dispatcher = subject.dispatcher
    ids = [str(uuid.uuid4()) for _ in range(2)]
    for number, task_id in enumerate(ids):
        dispatcher.submit(_curve_request(number), subject.queue, task_id=task_id)
    assert set(dispatcher.statuses(ids)) == set(ids)
    assert dispatcher.statuses([]) == {}
    for task_id in ids:
        _until_finished(dispatcher, task_id)


def test_a_withdrawn_trial_is_no_longer_pending(subject: Subject) -> None:
    dispatcher = subject.dispatcher
    task_id = dispatcher.submit(_curve_request(0), subject.idle_queue, task_id="withdrawn")
    dispatcher.withdraw([task_id], subject.idle_queue)
    assert task_id not in dispatcher.pending_ids(subject.idle_queue)
    dispatcher.withdraw([], subject.idle_queue)  # nothing to withdraw is no error


def test_a_live_worker_is_counted_on_its_queue(subject: Subject) -> None:
    count = wait_until(
        lambda: subject.dispatcher.live_worker_count(subject.queue), 60, "a worker to beat"
    )
    assert count == 1


def test_a_wait_for_results_is_woken_by_a_trial_s_result(subject: Subject) -> None:
    """The driver's pause: it ends when a trial sent through the dispatcher stores its
    result, long before its timeout (returning True), and the result is there to read."""
    dispatcher = subject.dispatcher
    task_id = dispatcher.submit(
        trial_request(study="conformance", number=3), subject.queue, task_id=str(uuid.uuid4())
    )

    woken = dispatcher.wait_for_results(90)

    assert woken, "waited out the whole timeout: no result announced"
    assert _until_finished(dispatcher, task_id)[-1].phase is TaskPhase.FINISHED


def test_a_stored_result_is_announced_by_its_task_id_once(subject: Subject) -> None:
    """Passes between the driver's full ones read only the trials announced
    (driver/pacing.py). Once the dispatcher listens (a trial sent, and an answer taken since),
    each stored result is announced by its task id, in one answer only, and no answer says
    it may have missed one (None) while the broker is up."""
    dispatcher = subject.dispatcher
    first = dispatcher.submit(
        trial_request(study="conformance", number=4), subject.queue, task_id=str(uuid.uuid4())
    )
    _until_finished(dispatcher, first)
    dispatcher.results_announced()
    task_id = dispatcher.submit(
        trial_request(study="conformance", number=5), subject.queue, task_id=str(uuid.uuid4())
    )
    answers: list[set[str] | None] = []

    def heard() -> bool:
        dispatcher.wait_for_results(1.0)
        answers.append(dispatcher.results_announced())
        return any(task_id in answer for answer in answers if answer is not None)

    wait_until(heard, 90, lambda: f"{task_id} announced (answers: {answers})")
    dispatcher.wait_for_results(0.2)
    answers.append(dispatcher.results_announced())

    assert None not in answers, answers
    assert sum(task_id in answer for answer in answers if answer is not None) == 1, answers
    assert _until_finished(dispatcher, task_id)[-1].phase is TaskPhase.FINISHED
