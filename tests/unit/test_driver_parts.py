"""The driver loop's parts, each on its own: built with their collaborators (an in-memory
Optuna study, the stand-in dispatcher and report channel of tests/stand_in.py), no loop."""

from __future__ import annotations

import textwrap
from concurrent.futures import Future
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from stand_in import StandInDispatcher, StandInReports
from trial_requests import trial_request

from trialq.driver._storage.store import store_for
from trialq.driver.budget import Budget
from trialq.driver.fate import Known, Resends
from trialq.driver.forgetting import Forgetting
from trialq.driver.in_flight import InFlight, Sighting
from trialq.driver.ledger import Ledger
from trialq.driver.relay import ReportRelay
from trialq.driver.sending import Sender
from trialq.driver.watch import Watch
from trialq.spec import StudySpec, load_spec
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.record import TrialRecord


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def spec(tmp_path: Path) -> StudySpec:
    path = tmp_path / "study.toml"
    path.write_text(
        textwrap.dedent(
            """
            [study]
            name = "parts"
            n_trials = 3
            [trial]
            entrypoint = "trials:quadratic"
            [space.x]
            type = "float"
            low = 0
            high = 1
            """
        )
    )
    return load_spec(path)


def _entry(study: optuna.Study, task_id: str = "t1") -> InFlight:
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    return InFlight(trial, trial_request(study=study.study_name, number=trial.number), task_id)


def test_the_ledger_counts_what_earlier_runs_finished_and_reports_a_budget_once() -> None:
    study = optuna.create_study()
    on_gpu = {"duration_s": 3600, "gpus": 2, "gpu_model": "NVIDIA H100"}
    study.add_trial(optuna.create_trial(value=1.0, user_attrs=on_gpu))
    study.add_trial(optuna.create_trial(state=TrialState.FAIL))
    ledger = Ledger(study, Clock(), Budget(10, max_failed_trials=2))

    ledger.open()
    assert ledger.n_trials == 10
    assert (ledger.counts.complete, ledger.counts.failed, ledger.gpu_hours) == (1, 1, 2.0)
    assert ledger.reached() is None
    ledger.record(TrialState.FAIL, TrialRecord(duration_s=1800, gpu_model="NVIDIA H100"))

    stop = ledger.reached()
    assert stop is not None and stop.budget == "max_failed_trials" and stop.failing
    assert ledger.reached() is None, "a budget is reported once"
    assert ledger.gpu_hours == 2.5 and ledger.last_run().stopped_by == "max_failed_trials"


def test_the_relay_records_new_values_and_raises_the_prune_flag_once() -> None:
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.0))
    channel, clock = StandInReports(), Clock()
    relay = ReportRelay(channel, store_for(study), clock, reporting=True)
    entry = _entry(study)
    channel.values[entry.address] = [0.5, 2.0]
    clock.now = 7.0

    relay.relay([entry])
    relay.relay([entry])

    assert study.trials[0].intermediate_values == {0: 0.5, 1: 2.0}
    assert entry.reports_seen == "2" and entry.prune_requested_at == 7.0
    assert channel.prune_requested == {entry.address}


def test_the_relay_relays_nothing_for_several_objectives_and_forgets_in_one_call() -> None:
    study = optuna.create_study(directions=["minimize", "minimize"])
    channel = StandInReports()
    relay = ReportRelay(channel, store_for(study), Clock(), reporting=False)
    first, second = _entry(study, "t1"), _entry(study, "t2")
    channel.values[first.address] = [0.5]

    relay.relay([first])
    relay.forget(first)
    relay.forget(second)
    assert channel.values, "nothing is dropped before the pass's one call"
    relay.forget_told()

    assert study.trials[0].intermediate_values == {}
    assert channel.values == {}


class BeaconsAsked(StandInDispatcher):
    """The stand-in dispatcher, counting the beacons asked for one by one."""

    def __init__(self, beating: bool) -> None:
        super().__init__([])
        self.beating, self.asked = beating, 0

    def attempt_alive(self, task_id: str) -> bool:
        self.asked += 1
        return self.beating


def _watch(dispatcher: StandInDispatcher, clock: Clock) -> Watch:
    return Watch(dispatcher, dispatcher.channel, "q", clock, 5.0, 10.0, lambda: None)


def _seen(watch: Watch, entry: InFlight, status: TaskStatus, queued: set[str] | None) -> Known:
    """What the pass knows of `entry`, its sighting kept on the entry as the loop keeps it."""
    known, sighting = watch.known(entry, status, queued)
    entry.saw(sighting)
    return known


def test_the_watch_returns_what_it_saw_and_writes_nothing_on_the_entry() -> None:
    study, dispatcher = optuna.create_study(), BeaconsAsked(beating=True)
    watch, entry = _watch(dispatcher, Clock()), _entry(study)
    status = TaskStatus(TaskPhase.WAITING, worker="w@host", log_file="a.log")

    _, sighting = watch.known(entry, status, {"t1"})

    assert sighting == Sighting("w@host", "a.log", claimed=True, beating=True)
    assert not entry.claimed and not entry.beacon_seen and entry.worker is None
    entry.saw(sighting)
    assert entry.claimed and entry.beacon_seen and entry.worker_host == "host"


def test_a_beacon_read_with_the_status_is_not_asked_again() -> None:
    study, dispatcher = optuna.create_study(), BeaconsAsked(beating=True)
    watch, entry = _watch(dispatcher, Clock()), _entry(study)

    read = _seen(watch, entry, TaskStatus(TaskPhase.RUNNING, worker="w", beating=False), None)
    asked = _seen(watch, entry, TaskStatus(TaskPhase.RUNNING, worker="w"), None)

    assert dispatcher.asked == 1, "only the status without a beacon asks"
    assert read.worker_alive, "its beacon gone, its worker still beats"
    assert asked.worker_alive


def test_a_running_attempt_whose_beacon_was_seen_and_is_gone_is_lost_though_its_worker_beats() -> (
    None
):
    """Issue 38, row 6: a twin of the same name keeps the worker's heartbeat fresh; the
    attempt's own process is gone (the stand-in's workers all beat)."""
    study, dispatcher = optuna.create_study(), BeaconsAsked(beating=True)
    watch, entry = _watch(dispatcher, Clock()), _entry(study)
    running = TaskStatus(TaskPhase.RUNNING, worker="w")

    assert _seen(watch, entry, running, None).worker_alive and entry.beacon_seen
    dispatcher.beating = False
    assert not _seen(watch, entry, running, None).worker_alive


def test_a_claim_is_lost_once_its_beacon_was_seen_and_is_gone() -> None:
    study, dispatcher = optuna.create_study(), BeaconsAsked(beating=True)
    watch, entry = _watch(dispatcher, Clock()), _entry(study)
    waiting = TaskStatus(TaskPhase.WAITING)

    assert not _seen(watch, entry, waiting, {"t1"}).claim_lost and entry.claimed
    assert not _seen(watch, entry, waiting, None).claim_lost, "no lost check, no claim checked"
    dispatcher.beating = False
    assert _seen(watch, entry, waiting, {"t1"}).claim_lost


def test_a_prune_is_overdue_past_its_grace_until_the_attempt_is_killed() -> None:
    study, clock = optuna.create_study(), Clock()
    watch, entry = _watch(StandInDispatcher([]), clock), _entry(study)
    running = TaskStatus(TaskPhase.RUNNING, worker="w")
    entry.prune_requested_at = 0.0

    clock.now = 10.0
    assert not _seen(watch, entry, running, None).prune_overdue
    clock.now = 10.5
    assert _seen(watch, entry, running, None).prune_overdue
    entry.terminated = True
    assert not _seen(watch, entry, running, None).prune_overdue


def test_the_lost_check_asks_the_broker_only_when_due() -> None:
    clock = Clock()
    watch = _watch(StandInDispatcher([]), clock)

    assert watch.queued_ids() == set()
    assert watch.queued_ids() is None
    clock.now = 5.0
    assert watch.queued_ids() == set()


def _sender(spec: StudySpec, dispatcher: StandInDispatcher) -> tuple[Sender, optuna.Study]:
    study = optuna.create_study(study_name="parts")
    return Sender(spec, study, dispatcher, store_for(study), Clock(), None), study


def test_the_sender_fills_the_room_and_no_more_than_the_trials_left(spec: StudySpec) -> None:
    dispatcher = StandInDispatcher([{}] * 3)
    sender, study = _sender(spec, dispatcher)

    assert sender.fill(n_trials=3, finished=0, max_in_flight=2)
    assert sender.outstanding == 2 and len(dispatcher.sent) == 2
    assert not sender.fill(n_trials=3, finished=1, max_in_flight=5)
    assert sender.outstanding == 2, "one finished, two in flight: none left to send"
    attrs = study.trials[0].user_attrs
    assert attrs["task_id"] in sender.in_flight and attrs["checkpoint_key"]


def test_a_resend_withdraws_the_old_task_and_keeps_the_trial(spec: StudySpec) -> None:
    dispatcher = StandInDispatcher([{}] * 2)
    withdrawn: list[str] = []
    dispatcher.withdraw = lambda ids, queue: withdrawn.extend(ids)  # type: ignore[method-assign]
    sender, _ = _sender(spec, dispatcher)
    sender.fill(n_trials=1, finished=0, max_in_flight=1)
    (old,) = sender.in_flight.values()

    sender.resend(old, new_attempt=True, resends=Resends(retries=1))

    (new,) = sender.in_flight.values()
    assert withdrawn == [old.task_id] and new.task_id != old.task_id
    assert (new.trial.number, new.request.attempt) == (old.trial.number, 2)
    assert new.request.checkpoint_key == old.request.checkpoint_key
    assert new.resends == Resends(retries=1)


def test_told_results_are_let_go_once_their_commit_is_done_and_a_failed_commit_s_wait() -> None:
    dispatcher = StandInDispatcher([])
    forgetting = Forgetting(dispatcher)
    first, second, third = Future[None](), Future[None](), Future[None]()
    forgetting.told("a")
    forgetting.committing(first)
    forgetting.told("b")
    forgetting.committing(second)
    forgetting.forget_written()
    assert dispatcher.forgotten == [], "no commit done yet"

    second.set_exception(OSError("the database went away"))
    first.set_result(None)
    forgetting.forget_written()
    assert dispatcher.forgotten == ["a"]

    forgetting.told("c")
    forgetting.committing(third)  # the failed commit's writes go in this one, first
    third.set_result(None)
    forgetting.forget_written()
    assert dispatcher.forgotten == ["a", "b", "c"]
    forgetting.told("d")
    forgetting.all_written()
    assert dispatcher.forgotten == ["a", "b", "c", "d"]


class CommitEndingWhileAsked(Future[None]):
    """A commit on the writer thread that ends between the driver's first look and any later
    one: `done()` is False the first time it is asked, True after."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def done(self) -> bool:
        self.asked += 1
        if self.asked == 2:
            self.set_result(None)
        return super().done()


def test_a_commit_that_ends_while_results_are_let_go_has_its_results_let_go_later() -> None:
    """Its attempts were once dropped from the books unforgotten: their keys stayed in Redis
    for the TTL (issue 42: 0 keys a trial a minute after the study)."""
    dispatcher = StandInDispatcher([])
    forgetting = Forgetting(dispatcher)
    done, ending = Future[None](), CommitEndingWhileAsked()
    done.set_result(None)
    forgetting.told("a")
    forgetting.committing(done)
    forgetting.told("b")
    forgetting.committing(ending)

    forgetting.forget_written()
    assert dispatcher.forgotten == ["a"]
    forgetting.forget_written()
    assert dispatcher.forgotten == ["a", "b"]
