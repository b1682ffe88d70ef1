"""The driver: Optuna's ask/tell loop over a queue of trial processes.

The driver is the single writer of trial states: it asks the study for params, sends each
trial through a `Dispatcher`, and tells each trial exactly once when its fate is known. It
retries only what was lost (a worker gone), re-attaches after a restart to trials it had in
flight, and relays intermediate values to Optuna's pruner. It rides out an outage of Redis or
of the storage (`trialq.driver.outage`), and a trial that someone else finishes while it runs
(optuna-dashboard's Fail button) is stopped, not told again.

`StudyDriver` is a short loop over parts, each owning one concern: `Sender` (what is in
flight, and sending it), `ReportRelay` (intermediate values to the pruner), `Watch` and
`OutsideCheck` (what became of each attempt), `Teller` (telling, and the failure streak),
`Ledger` (the books and budgets). What happens to an attempt is the pure rule's
(`trialq.driver.fate`); the loop applies its verdict in one place (`_apply`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial

import optuna
from optuna.trial import TrialState

from trialq import logs
from trialq.driver import fate, interrupts
from trialq.driver._storage.store import LAST_WRITE_WAIT_S, TrialStore, store_for
from trialq.driver.answering import Answering
from trialq.driver.bounded import within
from trialq.driver.budget import Budget, Stop
from trialq.driver.fate import Resend, Tell, Terminate, Wait
from trialq.driver.forgetting import Forgetting
from trialq.driver.in_flight import InFlight, recorded_resends
from trialq.driver.ledger import Ledger, budget_for
from trialq.driver.outage import Outages
from trialq.driver.pacing import PassPacing
from trialq.driver.progress import Counts, ProgressSink
from trialq.driver.relay import ReportRelay
from trialq.driver.search_space import DefineSpace, load_search_space
from trialq.driver.sending import Sender
from trialq.driver.study import study_key
from trialq.driver.study_lock import StudyLock
from trialq.driver.telling import Teller
from trialq.driver.watch import OutsideCheck, Watch
from trialq.errors import BrokerUnreachable, FailingTrials, Interrupted, SpecError, StudyDeleted
from trialq.oom_stand_ins import counted_state
from trialq.spec import StudySpec
from trialq.tracking import Tracking
from trialq.wire.dispatch import Dispatcher
from trialq.wire.messages import LAST_RUN_ATTR, Outcome
from trialq.wire.record import TrialRecord

__all__ = ["DriverOptions", "StudyDriver"]

_log = logging.getLogger("trialq.driver")  # the name log lines show; kept when the module moved


@dataclass
class DriverOptions:
    """How the loop paces itself; the defaults suit GPU trials of seconds to hours."""

    max_in_flight: int
    poll_interval_s: float = 0.05
    """The shortest pause between passes: longer where reading the trials in flight costs
    (`trialq.driver.pacing.PassPacing`); a result ends it at once."""
    lost_check_interval_s: float = 5.0
    outside_check_interval_s: float = 2.0
    """How often the storage is asked whether someone else finished a trial in flight."""
    outage_limit_s: float = 300.0
    """How long a lost broker or storage is waited for before the run gives up (exit 3)."""
    clock: Callable[[], float] = time.monotonic
    """The loop's one clock: pacing, deadlines and prune grace all read it."""


@dataclass
class StudyDriver:
    """Runs one study to `n_trials` finished trials through a dispatcher."""

    spec: StudySpec
    study: optuna.Study
    dispatcher: Dispatcher
    progress: ProgressSink
    options: DriverOptions
    study_lock: StudyLock | None = None
    """This driver's hold on the study (`trialq.driver.study_lock`), checked as it goes."""
    define_space: DefineSpace | None = None
    """The spec's `study.search_space`, loaded once (by `submit-study` before the study
    exists, else here)."""
    budget: Budget | None = None
    """What the run may spend (`trialq.driver.budget`): `n_trials` finished trials, and the
    rest that is set; by default the spec's. The run's one source of its number of trials."""
    store: TrialStore | None = None
    """Every write to the study's trials goes through it (`trialq.driver._storage.store`);
    by default the one for the study's storage."""
    tracking: Tracking = field(default_factory=lambda: Tracking(trackers=()))
    """Where each told trial is also recorded (`[tracking]`), started by the caller."""

    def __post_init__(self) -> None:
        spec, clock = self.spec, self.options.clock
        self._store = self.store = self.store or store_for(self.study)
        if self.define_space is None:
            self.define_space = load_search_space(spec)
        objectives = len(spec.study.objective_directions)
        channel = self.dispatcher.reports()
        self.budget = self.budget or budget_for(spec, spec.study.n_trials)
        self.ledger = Ledger(self.study, clock, self.budget)
        self.relay = ReportRelay(channel, self._store, clock, reporting=objectives == 1)
        self.sender = Sender(
            spec, self.study, self.dispatcher, self._store, clock, self.define_space
        )
        self.teller = Teller(spec, self.study, self._store, self.relay, self.ledger,
                             self.progress, self.tracking)  # fmt: skip
        self.watch = Watch(self.dispatcher, channel, spec.trial.queue, clock,
                           self.options.lost_check_interval_s, spec.trial.prune_grace_s,
                           self.teller.oom_telling)  # fmt: skip
        self.outside = OutsideCheck(
            self._store, self.study_lock, clock, self.options.outside_check_interval_s
        )
        self.forgetting = Forgetting(self.dispatcher)
        self.answering = Answering(self.dispatcher.questions(), study_key(self.study),
                                   lambda: self.sender.in_flight, self._store, channel, clock,
                                   reporting=objectives == 1)  # fmt: skip
        self.pacing = PassPacing()
        self.limits = fate.Limits(spec.trial.max_retries, spec.trial.max_preemptions,
                                  spec.trial.memory_limit_mb, spec.trial.retry_crashes,
                                  spec.study.objective_metrics)  # fmt: skip
        self._written: Future[None] | None = None
        """The last step's commit: its failure is how a storage outage shows."""
        self.ended_by: str | None = None
        """What ended the run short of a budget (`interrupted`, `max_failures_in_a_row`,
        `spec_error`, or the failing budget), as the last run's `stopped_by` says it."""
        self.left_in_flight = 0
        """Trials a failing stop or an interrupt found in flight: RUNNING in the study for the
        next run to send again (using no retry), as a hard wall leaves them."""

    @property
    def stop(self) -> Stop | None:
        """The budget that ended the run, once one has."""
        return self.ledger.stop

    @property
    def counts(self) -> Counts:
        """The study's finished trials by state."""
        return self.ledger.counts

    def run(self) -> None:
        """Ask, send, collect and tell until the budget's `n_trials` trials have finished, or
        another budget is reached."""
        self.ledger.open()
        for params in self.spec.enqueue:  # asked first; a set seen before is not enqueued
            self._store.enqueue(params)
        self._reattach()
        self._written = self._store.flush_behind()
        outages = Outages(self.options.outage_limit_s, self.options.clock)
        self.sender.new_trials.start_asking(self.spec.study.ask_processes)
        self.answering.start()
        try:
            while self._step(outages):
                self._pause(self.pacing.pause_s(self.options.clock()), outages)
            self.sender.new_trials.give_back_spares()
            self._write_all(outages)
            self._store.set_study_attr(LAST_RUN_ATTR, self.ledger.last_run().to_json())
        except KeyboardInterrupt:
            self.ended_by = "interrupted"
            self.left_in_flight = len(self.sender.in_flight)  # RUNNING, for the next run
            raise Interrupted(_interrupted(self.sender.withdraw_waiting())) from None
        except FailingTrials:
            self.ended_by = self.stop.budget if self.stop else "max_failures_in_a_row"
            self.left_in_flight = len(self.sender.in_flight)
            self.sender.leave_in_flight()  # failing: what runs now stops too, for a later run
            raise
        except SpecError:
            self.ended_by = "spec_error"
            self.sender.withdraw_waiting()
            raise
        except Exception as exc:
            if not self._store.lost_to_deletion(exc):
                raise
            self.sender.withdraw_waiting()
            deleted = exc if isinstance(exc, StudyDeleted) else None
            raise deleted or StudyDeleted.named(self.study.study_name) from None
        finally:
            outages.settled()
            self.answering.stop()
            self.sender.new_trials.stop_asking()
            self.sender.new_trials.give_back_spares()
            self._record_early_end()
            self._write_told()

    def _step(self, outages: Outages) -> bool:
        """One pass: collect and tell, ask into the room that made, relay reports, then hand
        what is left pending to the storage. False once everything is told.

        A steady pass (one trial told, the next asked) is one transaction: the new trial's
        `persist` carries the tell. It is committed while the loop goes on, and the trial is
        sent once it is in the database (`_pause`). While the broker or the storage is away,
        the pass is retried with backoff (`Outages`); writes that failed stay pending and go
        in with the next commit."""
        interrupts.raise_if_came()
        more = True
        with outages.tolerated():
            self._check_storage(outages)
            self.forgetting.forget_written()
            self._collect()
            if self.teller.stop_reason is not None:
                raise FailingTrials(self.teller.stop_reason)
            self._check_budget()
            self._check_outside()
            self.sender.send_recorded()
            more = self.stop is None and self.sender.fill(
                self.ledger.n_trials, self.counts.finished, self.options.max_in_flight
            )
            self._relay()
            self.pacing.read(self.options.clock(), self.options.poll_interval_s)
            self.relay.forget_told()
        self._written = self._store.flush_behind()
        self.forgetting.committing(self._written)
        self.sender.rerecord_failed(self._written)
        outstanding = self.sender.outstanding
        self.progress.update(self.counts, self.ledger.best_value(), outstanding)
        return bool(more or outstanding)

    def _pause(self, seconds: float, outages: Outages) -> None:
        """Wait for the next pass, sending each trial the moment its record is written, then
        asking ahead once all are out; the pass comes as soon as a trial's result does
        (`Dispatcher.wait_for_results`), at the latest `seconds` on (what else a pass looks
        at: reports, starts, lost workers)."""
        clock = self.options.clock
        deadline = clock() + seconds
        while self.sender.recording and clock() < deadline:
            with outages.tolerated():
                if not self.sender.send_recorded(deadline):
                    break
        if not self.sender.recording and self.stop is None:
            with outages.tolerated():
                finished = self.counts.finished
                left = self.ledger.n_trials - finished - self.sender.outstanding
                self.sender.new_trials.ask_ahead(self.spec.study.ask_ahead, left)
                self.sender.new_trials.sync_asking(left)
        with self.answering.open():  # trials' questions answered while the loop waits
            self.dispatcher.wait_for_results(max(0.0, deadline - clock()))

    def _write_all(self, outages: Outages) -> None:
        """The run is done once every tell is in the database, outage or not. Then the told
        trials' results are dropped from the broker; with the broker away they stay until
        their TTL (`TRIALQ_KEY_TTL_S`): the run is done anyway."""
        written = False
        while not written:
            with outages.tolerated():
                self._store.flush()
                written = True
        try:
            self.forgetting.all_written()
        except BrokerUnreachable as exc:
            _log.warning("told trials' results left in the broker until their TTL: %s", exc)

    def _check_storage(self, outages: Outages) -> None:
        """Raise the last commit's error, if it failed; while the storage is known to be
        away, ask it until it answers (a pass may have nothing to write)."""
        if self._written is not None and self._written.done():
            self._written.result()
        if outages.away("storage"):
            self._store.ping()
            outages.recovered("storage")

    def _reattach(self) -> None:
        """Take back trials a previous driver left RUNNING (`fate.reattach`)."""
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial = optuna.Trial(self.study, frozen._trial_id)
            record = TrialRecord.read(frozen.user_attrs)
            task_id, key = record.task_id, record.checkpoint_key
            attempt = 1 if record.attempts is None else record.attempts
            resends = recorded_resends(record)
            match fate.reattach(task_id, bool(frozen.params)):
                case fate.Abandon() as verdict:
                    self.teller.abandon(trial, verdict)
                case fate.SendAgain():
                    self.sender.send(trial, attempt, key, resends)
                case fate.Follow():
                    assert task_id is not None
                    self.sender.follow(trial, task_id, attempt, key, resends)

    def _collect(self) -> None:
        """Learn what became of the trials in flight this pass reads (all of them, or those
        whose results were announced: `PassPacing`), and act on it."""
        in_flight, clock = self.sender.in_flight, self.options.clock
        started = clock()
        announced = self.dispatcher.results_announced()
        statuses = self.dispatcher.statuses(self.pacing.to_read(started, announced, in_flight))
        self.pacing.reading(started, clock())
        queued = self.watch.queued_ids() if self.pacing.full else None  # it covers all
        self.relay.read_final(statuses, in_flight)
        for task_id, status in statuses.items():
            entry = in_flight[task_id]
            known, seen = self.watch.known(entry, status, queued)
            entry.saw(seen)
            self._apply(entry, fate.decide(known, self.limits))
        self.relay.end_pass()

    def _relay(self) -> None:
        """On a full pass, new intermediate values to the pruner (a read the pacing counts)."""
        if not self.pacing.full:
            return
        clock = self.options.clock
        started = clock()
        self.relay.relay(self.sender.in_flight.values())
        self.pacing.reading(started, clock())

    def _apply(self, entry: InFlight, action: fate.Action) -> None:
        """Carry out the fate rule's action for one attempt: the one place that does."""
        if isinstance(action, Tell | Resend) and action.terminate:
            self.dispatcher.terminate(entry.task_id)
        match action:
            case Tell():
                self._finish(entry, action)
            case Resend():
                self._resend(entry, action)
            case Terminate():
                self.dispatcher.terminate(entry.task_id)
                entry.terminated = True
            case Wait(unseen_checks=unseen):
                entry.unseen_checks = unseen

    def _finish(self, entry: InFlight, verdict: Tell) -> None:
        """Tell the trial; a spec that cannot pick its objective stops the run."""
        self.relay.drain(entry)
        self.sender.settled(entry)
        self.teller.tell(entry, verdict)
        self.forgetting.told(entry.task_id)
        if verdict.ends_run is not None:
            raise SpecError(verdict.ends_run)

    def _resend(self, entry: InFlight, resend: Resend) -> None:
        """Withdraw the old task for good, then send the same trial again."""
        if resend.keep_artifacts is not None:  # what the cut-short attempt saved stays
            self._store.link_artifacts(entry.trial, resend.keep_artifacts.artifacts)
        self.relay.forget(entry)
        _log.info("%s", resend.reason, extra=logs.fields(entry.request))
        if resend.new_attempt or resend.refusal is not None:
            self.progress.note(f"#{entry.request.number} sent again: {resend.reason}")
        if resend.refusal is not None:
            self.teller.saw(Outcome.REFUSED, resend.refusal)
        self.sender.resend(entry, resend.new_attempt, resend.resends)

    def _check_outside(self) -> None:
        """Trials someone else finished while they ran: their state stands, the trial's
        process is killed, and it is not retried."""
        for entry, frozen in self.outside.finished_elsewhere(self.sender.in_flight.values()):
            if entry is None:  # its result came in as it was finished there: theirs stands
                _log.warning("trial #%d was finished from outside as %s; that state stands",
                             frozen.number, frozen.state.name)  # fmt: skip
                continue
            verdict = fate.stopped_outside(frozen.state, counted_state(frozen))
            self.ledger.finished_elsewhere(frozen)
            self.dispatcher.terminate(entry.task_id)
            self.sender.settled(entry)
            self.teller.stopped(entry, verdict)

    def _check_budget(self) -> None:
        """Once a budget is reached: no new trial; the failing kind stops the run now, and
        a hard wall stops the trials in flight for a later run."""
        stop = self.ledger.reached()
        if stop is None:
            return
        _log.info("%s", stop.line)  # said once, by the command (a warning printed it twice)
        if stop.failing:
            raise FailingTrials(stop.line)
        if stop.budget == "max_wall_s" and self.ledger.budget.hard_wall:
            self.sender.leave_in_flight()

    def _record_early_end(self) -> None:
        """A run ended short of a budget (an interrupt, failures) is the last run too, for
        `trialq status`; a storage that does not answer leaves the earlier record."""
        if self.ended_by is None:
            return
        record = self.ledger.last_run(self.ended_by).to_json()
        try:  # bounded as the last tells are: Ctrl-C while the database hangs ends the run
            write = partial(self._store.set_study_attr, LAST_RUN_ATTR, record)
            within(LAST_WRITE_WAIT_S, write, "trialq-last-run")
        except Exception as exc:  # the error that stops the run is already on its way
            _log.warning("the last run's end not recorded: %s", exc)

    def _write_told(self) -> None:
        """On the way out, whatever stopped the run: write the trials told since the last step.
        If the storage is away, they stay RUNNING there with their task ids, and the next run
        tells them again. Waits `LAST_WRITE_WAIT_S` at most: Ctrl-C ends a run promptly."""
        try:
            self._store.flush(LAST_WRITE_WAIT_S)
        except Exception as exc:  # the error that stops the run is already on its way
            if not self._store.lost_to_deletion(exc):  # a deleted study takes no more tells
                _log.warning("told trials not written (the next run tells them again): %s", exc)


def _interrupted(withdrawn: bool) -> str:
    """The line an interrupt ends the run with: it says queued trials were withdrawn only
    where they were (with Redis frozen, nothing is withdrawn)."""
    if withdrawn:
        return "interrupted: queued trials withdrawn; rerun to resume"
    return (
        "interrupted: the broker did not answer, so queued trials were not withdrawn "
        "(a worker may still run them); rerun to resume"
    )
