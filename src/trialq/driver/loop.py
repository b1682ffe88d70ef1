"""The driver: Optuna's ask/tell loop over a queue of trial processes.

The driver is the single writer of trial states: it asks the study for params, sends each
trial through a `Dispatcher`, and tells each trial exactly once when its fate is known. It
retries only what was lost (a worker gone), re-attaches after a restart to trials it had in
flight, and relays intermediate values to Optuna's pruner. It rides out an outage of Redis or
of the storage (`trialq.driver.outage`), and a trial that someone else finishes while it runs
(optuna-dashboard's Fail button) is stopped, not told again.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import optuna
import redis
from optuna.trial import FrozenTrial, TrialState

from trialq import logs
from trialq.driver import budget as budgets
from trialq.driver import fate
from trialq.driver._storage.store import LAST_WRITE_WAIT_S, TrialStore, store_for
from trialq.driver.budget import Budget, Spent, Stop
from trialq.driver.failure_streak import FailureStreak
from trialq.driver.fate import Known, Resend, Resends, Tell, Terminate, Wait
from trialq.driver.objective import objective_of
from trialq.driver.oom_constraint import OOM_CONSTRAINT, OomTelling, oom_telling, sampler_kind
from trialq.driver.outage import Outages
from trialq.driver.pacing import Periodic
from trialq.driver.progress import Counts, ProgressSink
from trialq.driver.search_space import DefineSpace, load_search_space
from trialq.driver.spec import StudySpec
from trialq.driver.study import distributions
from trialq.driver.study_lock import StudyLock
from trialq.errors import BrokerUnreachable, FailingTrials, Interrupted, SpecError, StudyDeleted
from trialq.oom_stand_ins import counted_state, has_stand_in_values
from trialq.wire.channel import Report, TrialAddress
from trialq.wire.dispatch import Dispatcher, TaskPhase, TaskStatus, TrialReports
from trialq.wire.failures import failure_line
from trialq.wire.messages import LAST_RUN_ATTR, Outcome, TrialRequest, TrialResult
from trialq.wire.messages import checkpoint_key as new_checkpoint_key
from trialq.wire.outcome import Told
from trialq.wire.record import TrialRecord

FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
_log = logging.getLogger("trialq.driver")  # the name log lines show; kept when the module moved


@dataclass
class InFlight:
    """A trial the driver has sent and not yet told."""

    trial: optuna.Trial
    request: TrialRequest
    task_id: str
    resends: Resends = field(default_factory=Resends)
    reports_seen: str = "0"
    prune_requested_at: float | None = None
    terminated: bool = False
    unseen_checks: int = 0
    worker: str | None = None
    """The worker running it, as its status last said (for a trial stopped from outside)."""
    claimed: bool = False
    """A trial process's beacon for it was seen while Celery still had it waiting."""
    sent_at: float = field(default_factory=time.time)

    @property
    def address(self) -> TrialAddress:
        """The channel address of the attempt in flight."""
        return TrialAddress(self.request.study, self.request.number, self.request.attempt)


@dataclass
class Recording:
    """A trial asked and recorded, to be sent once its record is in the database."""

    trial: optuna.Trial
    request: TrialRequest
    task_id: str
    resends: Resends
    recorded: Future[None]


@dataclass
class DriverOptions:
    """How the loop paces itself; the defaults suit GPU trials of seconds to hours."""

    max_in_flight: int
    poll_interval_s: float = 0.05
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
    """What the run may spend besides `n_trials` (`trialq.driver.budget`); by default the
    spec's."""
    stop: Stop | None = None
    """The budget that ended the run, once one has."""
    store: TrialStore | None = None
    """Every write to the study's trials goes through it (`trialq.driver._storage.store`);
    by default the one for the study's storage."""
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    recording: list[Recording] = field(default_factory=list)
    """Trials whose record is on its way to the database, in the order they were asked."""
    unsent: list[Recording] = field(default_factory=list)
    """Asked trials whose sending failed (broker away); sent before any new one."""
    counts: Counts = field(default_factory=Counts)
    _written: Future[None] | None = None
    """The last step's commit: its failure is how a storage outage shows."""
    channel: TrialReports | None = field(init=False, default=None)
    """Where trials in flight report, as the dispatcher says (`Dispatcher.reports`)."""

    def __post_init__(self) -> None:
        self.channel = self.dispatcher.reports()
        if self.store is None:
            self.store = store_for(self.study)
        self.limits = fate.Limits(
            self.spec.trial.max_retries,
            self.spec.trial.max_preemptions,
            self.spec.trial.memory_limit_mb,
            self.spec.trial.retry_crashes,
        )
        self.streak = FailureStreak(self.spec.study.max_failures_in_a_row)
        self._stop_reason: str | None = None
        self._gpus = int(getattr(self.spec.trial, "gpus", 1))
        self._gpu_hours = 0.0
        self._started = self.options.clock()
        self._lost_check = Periodic(self.options.lost_check_interval_s)
        self._outside_check = Periodic(self.options.outside_check_interval_s)
        self._final_reports: dict[TrialAddress, list[Report]] = {}
        """Reports of attempts that ended, read at once in this pass (`_read_final_reports`)."""
        self._to_forget: list[TrialAddress] = []
        """Attempts done with in this pass, whose report keys go in one call."""
        if self.define_space is None:
            self.define_space = load_search_space(self.spec)

    def run(self, n_trials: int) -> None:
        """Ask, send, collect and tell until `n_trials` trials have finished, or a budget
        is reached."""
        self.budget = self.budget or budget_for(self.spec, n_trials)
        n_trials = self.budget.n_trials
        self._started = self.options.clock()
        self._count_finished()
        self._enqueue_known()
        self._reattach()
        self._written = self._store.flush_behind()
        outages = Outages(self.options.outage_limit_s, self.options.clock)
        try:
            while self._step(n_trials, outages):
                self._pause(self.options.poll_interval_s, outages)
            self._write_all(outages)
            self._record_run()
        except KeyboardInterrupt:
            self._withdraw_waiting()
            raise Interrupted("interrupted: queued trials withdrawn; rerun to resume") from None
        except (SpecError, FailingTrials):
            self._withdraw_waiting()
            raise
        except Exception as exc:
            if not self._store.lost_to_deletion(exc):
                raise
            self._withdraw_waiting()
            raise StudyDeleted.named(self.study.study_name) from None
        finally:
            self._write_told()

    def _step(self, n_trials: int, outages: Outages) -> bool:
        """One pass: collect and tell, ask into the room that made, relay reports, then hand
        what is left pending to the storage. False once everything is told.

        A steady pass (one trial told, the next asked) is one transaction: the new trial's
        `persist` carries the tell. It is committed while the loop goes on, and the trial is
        sent once it is in the database (`_pause`). While the broker or the storage is away,
        the pass is retried with backoff (`Outages`); writes that failed stay pending and go
        in with the next commit."""
        more = True
        with outages.tolerated():
            self._check_storage(outages)
            self._collect()
            if self._stop_reason is not None:
                raise FailingTrials(self._stop_reason)
            self._check_budget()
            self._check_outside()
            self._send_recorded()
            more = self._fill(n_trials)
            self._relay_reports()
            self._forget_told()
        self._written = self._store.flush_behind()
        for recording in self.recording:  # a record whose commit failed waits for this one
            if _failed(recording.recorded):
                recording.recorded = self._written
        self.progress.update(self.counts, self._best_value(), self._outstanding)
        return bool(more or self._outstanding)

    def _pause(self, seconds: float, outages: Outages) -> None:
        """Wait for the next pass, sending each trial the moment its record is written; the
        pass comes as soon as a trial's result does (`Dispatcher.wait_for_results`), at the
        latest `seconds` on (what else a pass looks at: reports, starts, lost workers)."""
        clock = self.options.clock
        deadline = clock() + seconds
        while self.recording and clock() < deadline:
            with outages.tolerated():
                if not self._send_recorded(deadline):
                    break
        self.dispatcher.wait_for_results(max(0.0, deadline - clock()))

    def _write_all(self, outages: Outages) -> None:
        """The run is done once every tell is in the database, outage or not."""
        written = False
        while not written:
            with outages.tolerated():
                self._store.flush()
                written = True

    def _check_storage(self, outages: Outages) -> None:
        """Raise the last commit's error, if it failed; while the storage is known to be
        away, ask it until it answers (a pass may have nothing to write)."""
        if self._written is not None and self._written.done():
            self._written.result()
        if outages.away("storage"):
            self._store.ping()
            outages.recovered("storage")

    @property
    def _store(self) -> TrialStore:
        assert self.store is not None, "set in __post_init__"
        return self.store

    @property
    def _outstanding(self) -> int:
        """Trials asked and not yet told: sent, or on their way to being sent."""
        return len(self.in_flight) + len(self.recording)

    # --- sending -----------------------------------------------------------------------

    def _fill(self, n_trials: int) -> bool:
        """Send new trials while there is room; True while more remain to be sent."""
        if self.stop is not None:
            return False
        while self.unsent:
            unsent = self.unsent.pop(0)
            self._send(unsent.trial, unsent.request.attempt, unsent.request.checkpoint_key,
                       unsent.resends)  # fmt: skip
        while (
            self._outstanding < self.options.max_in_flight
            and self.counts.finished + self._outstanding < n_trials
        ):
            self._send(self._ask(), 1, None, Resends())
        return self.counts.finished + self._outstanding < n_trials

    def _ask(self) -> optuna.Trial:
        if self.spec.space:
            return self.study.ask(distributions(self.spec))
        assert self.define_space is not None
        trial = self.study.ask()
        self.define_space(trial)
        return trial

    def _request(
        self, trial: optuna.Trial, attempt: int, checkpoint_key: str | None, preemptions: int
    ) -> TrialRequest:
        return TrialRequest(
            study=self.study.study_name,
            number=trial.number,
            attempt=attempt,
            params=dict(trial.params),
            entrypoint=self.spec.trial.entrypoint.resolved(self.spec.directory),
            timeout_s=self.spec.trial.timeout_s,
            hard_limit_s=self.spec.trial.hard_limit_s,
            memory_limit_mb=self.spec.trial.memory_limit_mb,
            checkpoint_key=checkpoint_key,
            keep_checkpoints=self.spec.trial.keep_checkpoints,
            preemptions=preemptions,
            framework=self.spec.trial.framework,
        )

    def _send(
        self, trial: optuna.Trial, attempt: int, checkpoint_key: str | None, resends: Resends
    ) -> None:
        """Record the attempt in the storage, and send it once the record is written: a trial
        in a queue always has its params, task id and checkpoint key in the database, so a
        restarted driver finds it and its next attempt finds the same checkpoint folder."""
        key = checkpoint_key or new_checkpoint_key(self.study.study_name, trial.number)
        request = self._request(trial, attempt, key, resends.preemptions)
        task_id = str(uuid.uuid4())
        record = TrialRecord(
            task_id=task_id, attempts=attempt, checkpoint_key=key,
            retries=resends.retries, preemptions=resends.preemptions,
        )  # fmt: skip
        self._store.set_attrs(trial, record.attrs())
        written = self._store.flush_behind()
        self.recording.append(Recording(trial, request, task_id, resends, written))
        self._send_recorded()

    def _send_recorded(self, deadline: float | None = None) -> bool:
        """Send the trials whose record is written, in the order they were asked; with a
        `deadline` (on the loop's clock), wait for each until then. False where the head's commit
        failed: it waits for the next step's commit, whose outcome the step checks."""
        while self.recording:
            head = self.recording[0]
            wait_s = 0.0 if deadline is None else max(0.0, deadline - self.options.clock())
            try:
                head.recorded.result(timeout=wait_s)
            except TimeoutError:
                return True
            except Exception:
                return False
            self.recording.pop(0)
            self._submit(head)
        return True

    def _submit(self, recorded: Recording) -> None:
        request, task_id = recorded.request, recorded.task_id
        try:
            self.dispatcher.submit(request, self.spec.trial.queue, task_id=task_id)
        except BaseException:
            self.unsent.append(recorded)
            raise
        self.in_flight[task_id] = InFlight(recorded.trial, request, task_id, recorded.resends)
        _log.info("sent task_id=%s params=%s", task_id, request.params, extra=logs.fields(request))

    def _reattach(self) -> None:
        """Take back trials a previous driver left RUNNING: wait for them or resend them.

        A trial is persisted with its params and task id in one transaction before it is
        sent, so one with neither was asked and never sent: it ends as failed, with a note,
        and a fresh trial takes its place.
        """
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial = optuna.Trial(self.study, frozen._trial_id)
            record = TrialRecord.read(frozen.user_attrs)
            task_id, key = record.task_id, record.checkpoint_key
            attempt = 1 if record.attempts is None else record.attempts
            resends = _recorded_resends(record)
            if task_id is None and not frozen.params:
                note = "never sent: the previous driver stopped between asking and sending it"
                never_sent = TrialRecord(outcome=Outcome.ERROR, error=note)
                self._store.set_attrs(trial, never_sent.attrs())
                self._store.tell(trial, TrialState.FAIL, None)
                self.counts.record(TrialState.FAIL)
            elif task_id is None:  # an older driver recorded ids after sending
                self._send(trial, attempt, key, resends)
            else:
                request = self._request(trial, attempt, key, resends.preemptions)
                self.in_flight[task_id] = InFlight(trial, request, task_id, resends)

    # --- collecting ----------------------------------------------------------------------

    def _collect(self) -> None:
        """Learn what became of each trial in flight, and act on it."""
        statuses = self.dispatcher.statuses(self.in_flight)
        queued = self._queued_ids() if self._lost_check.due(self.options.clock()) else None
        self._read_final_reports(statuses)
        for task_id, status in statuses.items():
            entry = self.in_flight[task_id]
            entry.worker = status.worker or entry.worker
            known = self._known(entry, status, queued)
            action = fate.decide(known, self.limits)
            started = status.phase is TaskPhase.RUNNING or known.claim_lost
            if started and isinstance(action, Resend | Tell):
                self.dispatcher.terminate(task_id)  # given up on: its process may still run
            self._apply(entry, action)
        self._final_reports = {}

    def _queued_ids(self) -> set[str]:
        started = self.options.clock()
        queued = self.dispatcher.pending_ids(self.spec.trial.queue)
        self._lost_check.took(started, self.options.clock())
        return queued

    def _known(self, entry: InFlight, status: TaskStatus, queued: set[str] | None) -> Known:
        """What the queue and the report channel say of one attempt in this pass."""
        alive = self._alive(entry, status)
        claim_lost = self._claim_lost(entry, status, queued)
        lost = fate.may_be_lost(status, alive, claim_lost)
        return Known(
            request=entry.request,
            status=status,
            resends=entry.resends,
            worker_alive=alive,
            queued=None if queued is None else entry.task_id in queued,
            claim_lost=claim_lost,
            unseen_checks=entry.unseen_checks,
            prune_overdue=self._prune_overdue(entry),
            terminated=entry.terminated,
            oom_rss=self.channel.memory_exceeded(entry.address) if lost and self.channel else None,
            stop_requested=bool(
                lost and self.channel and self.channel.stop_requested(entry.address)
            ),
        )

    def _claim_lost(self, entry: InFlight, status: TaskStatus, queued: set[str] | None) -> bool:
        """On a lost check, for an attempt Celery still has waiting: whether a trial process
        claimed it (its beacon seen on an earlier check) and beats no more. Its process writes
        the beacon just before Celery stores `STARTED`; a host lost in between leaves the
        message reserved until the visibility timeout (docs/reliability.md)."""
        if status.phase is not TaskPhase.WAITING or queued is None:
            return False
        beating = self.dispatcher.attempt_alive(entry.task_id)
        lost = entry.claimed and not beating
        entry.claimed = entry.claimed or beating
        return lost

    def _alive(self, entry: InFlight, status: TaskStatus) -> bool:
        """For a running attempt: whether its trial process still beats, or else its worker
        (its heartbeat asked only then: the beacon came with the status)."""
        if status.phase is not TaskPhase.RUNNING:
            return True
        if self.dispatcher.attempt_alive(entry.task_id):
            return True
        return not status.worker or self.dispatcher.worker_alive(status.worker)

    def _apply(self, entry: InFlight, action: fate.Action) -> None:
        """Carry out the fate rule's action for one attempt: the one place that does."""
        match action:
            case Tell(result=result):
                self._finish(entry, result)
            case Resend():
                self._resend(entry, action)
            case Terminate():
                self.dispatcher.terminate(entry.task_id)
                entry.terminated = True
            case Wait(unseen_checks=unseen):
                entry.unseen_checks = unseen

    def _check_outside(self) -> None:
        """Every few seconds: check this driver still holds its study, and ask the storage
        whether someone else finished a trial in flight (optuna-dashboard's Fail button is
        "stop this trial now"): their state stands, the trial's process is killed, and it is
        not retried."""
        started = self.options.clock()
        if not self._outside_check.due(started):
            return
        if self.study_lock is not None:
            self.study_lock.ensure_held()
        by_trial = {entry.trial._trial_id: entry for entry in self.in_flight.values()}
        finished = self._store.finished_elsewhere(by_trial)
        self._outside_check.took(started, self.options.clock())
        for frozen in finished:
            entry = by_trial.get(frozen._trial_id)
            if entry is None:  # its result came in as it was finished there: theirs stands
                _log.warning("trial #%d was finished from outside as %s; that state stands",
                             frozen.number, frozen.state.name)  # fmt: skip
            else:
                self._stopped(entry, frozen)

    def _stopped(self, entry: InFlight, frozen: FrozenTrial) -> None:
        """Kill a trial someone else finished, and note what became of it."""
        self.dispatcher.terminate(entry.task_id)
        del self.in_flight[entry.task_id]
        self._forget_reports(entry)
        self._orphan_checkpoint(entry)
        note = f"finished from outside as {frozen.state.name} while it ran; its process was killed"
        record = TrialRecord(
            outcome=Outcome.STOPPED,
            error=note,
            attempts=entry.request.attempt,
            task_id=entry.task_id,
            duration_s=round(time.time() - entry.sent_at, 3),
            worker_host=_host_of(entry.worker),
        )
        self._store.annotate(entry.trial, record.attrs())
        self.counts.record(counted_state(frozen))
        _log.warning("trial #%d %s", frozen.number, note, extra=logs.fields(entry.request))

    def _resend(self, entry: InFlight, resend: Resend) -> None:
        """Withdraw the old task for good, then send the same trial again."""
        if resend.keep_artifacts is not None:  # what the cut-short attempt saved stays
            self._store.link_artifacts(entry.trial, resend.keep_artifacts.artifacts)
        self._forget_reports(entry)
        _log.info("%s", resend.reason, extra=logs.fields(entry.request))
        if resend.refusal is not None:
            self._saw(Outcome.REFUSED, resend.refusal)
        self.dispatcher.withdraw([entry.task_id], self.spec.trial.queue)
        del self.in_flight[entry.task_id]
        attempt = entry.request.attempt + (1 if resend.new_attempt else 0)
        self._send(entry.trial, attempt, entry.request.checkpoint_key, resend.resends)

    # --- telling -------------------------------------------------------------------------

    def _finish(self, entry: InFlight, result: TrialResult) -> None:
        """Work out the objective, then tell; a spec that cannot pick one stops the run."""
        self._drain_reports(entry)
        del self.in_flight[entry.task_id]
        try:
            result, values = objective_of(result, self.spec.study.objective_metrics)
        except SpecError as exc:
            self._tell(entry, result.failed_as(Outcome.ERROR, str(exc)), None)
            raise
        self._tell(entry, result, values)

    def _tell(self, entry: InFlight, result: TrialResult, values: list[float] | None) -> None:
        """Record the result on the trial and tell Optuna, once."""
        record = TrialRecord.told(
            result, task_id=entry.task_id, attempts=entry.request.attempt,
            retries=entry.resends.retries, preemptions=entry.resends.preemptions, gpus=self._gpus,
        )  # fmt: skip
        self._store.set_attrs(entry.trial, record.attrs())
        self._gpu_hours += record.gpu_hours
        self._store.link_artifacts(entry.trial, result.artifacts)
        if result.reports_dropped:
            _log.warning("trial #%d: %d of its reports were dropped (docs/telemetry.md, "
                         "the bound on reports)", entry.request.number, result.reports_dropped,
                         extra=logs.fields(result))  # fmt: skip
        if not result.checkpoint_removed:
            self._orphan_checkpoint(entry)
        state = TrialState[result.outcome.told_as]
        self.counts.record(state)
        told = self._oom_telling() if result.outcome.teaches_a_constraint else None
        if told is not None:
            # A FAIL trial teaches no sampler anything; see trialq.driver.oom_constraint.
            if told.constrained:
                entry.trial.set_constraint(OOM_CONSTRAINT, 1.0)
            state, values = told.state, told.values
        self._store.tell(entry.trial, state, values if state is TrialState.COMPLETE else None)
        self._forget_reports(entry)
        _log.info("told state=%s outcome=%s", state.name, result.outcome, extra=logs.fields(result))
        if result.outcome.told_as is Told.FAIL:  # failed, or out of memory however it was told
            line = failure_line(entry.request.number, result.outcome, result.error)
            self.progress.trial_failed(line)
        self._saw(result.outcome, result.error)

    def _saw(self, outcome: Outcome, error: str | None) -> None:
        """Keep the streak of same failures; the first reason to stop stands."""
        reason = self.streak.saw(outcome, error)
        if reason is not None and self._stop_reason is None:
            self._stop_reason = reason

    def _oom_telling(self) -> OomTelling | None:
        study = self.spec.study
        if not study.oom_as_constraint:
            return None
        complete = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        seen = [t.values for t in complete if not has_stand_in_values(t)]
        return oom_telling(sampler_kind(self.study.sampler), study.objective_directions, seen)

    def _orphan_checkpoint(self, entry: InFlight) -> None:
        """The trial is over and no process of it removed its checkpoint folder (it was
        killed, or gave up): ask a later trial process to (`trialq.trial.checkpoints`)."""
        key = entry.request.checkpoint_key
        if key is None or self.spec.trial.keep_checkpoints or self.channel is None:
            return
        with contextlib.suppress(redis.RedisError):
            self.channel.orphan_checkpoint(key)

    def _forget_reports(self, entry: InFlight) -> None:
        """Drop the attempt's report keys with the others of this pass (`_forget_told`)."""
        if self.channel is not None:
            self._to_forget.append(entry.address)

    def _forget_told(self) -> None:
        """One call for every attempt done with in this pass: a round trip each was most of
        a driver's time a trial, far from its Redis. Where Redis is away, the next pass
        tries again (the keys expire anyway: `wire.channel.KEY_TTL_S`)."""
        if self.channel is None or not self._to_forget:
            return
        with contextlib.suppress(redis.RedisError):
            self.channel.forget(*self._to_forget)
            self._to_forget = []

    # --- pruning -------------------------------------------------------------------------

    def _relay_reports(self) -> None:
        """Hand new intermediate values to Optuna and raise the prune flag when it says so."""
        if not self._reporting:
            return
        assert self.channel is not None
        by_address = {entry.address: entry for entry in self.in_flight.values()}
        positions = {address: entry.reports_seen for address, entry in by_address.items()}
        for address, reports in self.channel.read_new(positions).items():
            self._relay(by_address[address], reports)

    def _drain_reports(self, entry: InFlight) -> None:
        """Before a trial is told: the values it reported since the last relay. Its process
        wrote them before its result, so the curve Optuna keeps is whole; the pruner judges
        later trials against it. Called while the trial is still in flight, so a broker
        outage here leaves it to be collected again."""
        if not self._reporting:
            return
        assert self.channel is not None
        reports = self._final_reports.pop(entry.address, None)
        if reports is None:  # told while it ran (its worker lost): not read with the ended
            found = self.channel.read_new({entry.address: entry.reports_seen})
            reports = found.get(entry.address, [])
        self._record_reports(entry, reports)

    def _read_final_reports(self, statuses: dict[str, TaskStatus]) -> None:
        """The last reports of every attempt that ended, in one read before any is told
        (`_drain_reports` takes them from here): read after the statuses, so nothing a trial
        reported before its result is missed."""
        if not self._reporting:
            return
        assert self.channel is not None
        ended = [
            self.in_flight[task_id]
            for task_id, status in statuses.items()
            if status.phase in (TaskPhase.FINISHED, TaskPhase.FAILED)
        ]
        if ended:
            positions = {entry.address: entry.reports_seen for entry in ended}
            found = self.channel.read_new(positions)
            self._final_reports = {address: found.get(address, []) for address in positions}

    @property
    def _reporting(self) -> bool:
        """Whether trials report intermediate values (Optuna takes none for several
        objectives)."""
        return self.channel is not None and len(self.spec.study.objective_directions) == 1

    def _relay(self, entry: InFlight, reports: list[Report]) -> None:
        self._record_reports(entry, reports)
        if entry.prune_requested_at is None and entry.trial.should_prune():
            assert self.channel is not None
            self.channel.request_prune(entry.address)
            entry.prune_requested_at = self.options.clock()

    def _record_reports(self, entry: InFlight, reports: list[Report]) -> None:
        values = {report.step: report.value for report in reports}  # the latest per step
        self._store.record_intermediates(entry.trial, values)
        if reports:
            entry.reports_seen = reports[-1].stream_id

    def _prune_overdue(self, entry: InFlight) -> bool:
        asked = entry.prune_requested_at
        return (
            asked is not None
            and not entry.terminated
            and self.options.clock() - asked > self.spec.trial.prune_grace_s
        )

    # --- bookkeeping ---------------------------------------------------------------------

    def _count_finished(self) -> None:
        for frozen in self.study.get_trials(deepcopy=False, states=FINISHED_STATES):
            self.counts.record(counted_state(frozen))
            self._gpu_hours += TrialRecord.read(frozen.user_attrs).gpu_hours

    def _enqueue_known(self) -> None:
        """The spec's `[[enqueue]]` params, waiting to be asked first; a set the study has
        seen already (waiting, running or finished, from any run) is not enqueued again."""
        for params in self.spec.enqueue:
            self.study.enqueue_trial(dict(params), skip_if_exists=True)

    def _check_budget(self) -> None:
        """Once a budget is reached: no new trial; the failing kind stops the run now, and
        a hard wall stops the trials in flight for a later run."""
        if self.stop is not None or self.budget is None:
            return
        self.stop = budgets.reached(self.budget, self._spent())
        if self.stop is None:
            return
        _log.warning("%s", self.stop.line)
        if self.stop.failing:
            raise FailingTrials(self.stop.line)
        if self.stop.budget == "max_wall_s" and self.budget.hard_wall:
            self._leave_in_flight()

    def _leave_in_flight(self) -> None:
        """Stop every trial in flight and leave it RUNNING in the study, for the next run to
        send again (a withdrawn or killed attempt uses no retry)."""
        self._withdraw_waiting()
        for task_id in list(self.in_flight):
            self.dispatcher.terminate(task_id)
        self.in_flight.clear()

    def _spent(self) -> Spent:
        return Spent(
            finished=self.counts.finished,
            failed=self.counts.failed,
            wall_s=self.options.clock() - self._started,
            gpu_hours=self._gpu_hours,
            best=self._best_value(),
        )

    def usage(self) -> dict[str, dict[str, Any]]:
        """Each budget set, its limit and what is used (the summary's `budgets`)."""
        assert self.budget is not None, "set by run()"
        return budgets.usage(self.budget, self._spent())

    def _record_run(self) -> None:
        """What ended the run and how much of each budget is used, on the study, for
        `trialq status` (one key, replaced by each run)."""
        stopped_by = self.stop.budget if self.stop is not None else "n_trials"
        self._store.set_study_attr(
            LAST_RUN_ATTR, {"stopped_by": stopped_by, "budgets": self.usage()}
        )

    def _best_value(self) -> float | None:
        if len(self.spec.study.objective_directions) > 1 or self.counts.complete == 0:
            return None
        try:
            return float(self.study.best_value)
        except ValueError:
            return None

    def _write_told(self) -> None:
        """On the way out, whatever stopped the run: write the trials told since the last step.
        If the storage is away, they stay RUNNING there with their task ids, and the next run
        tells them again. Waits `LAST_WRITE_WAIT_S` at most: Ctrl-C ends a run promptly."""
        try:
            self._store.flush(LAST_WRITE_WAIT_S)
        except Exception as exc:  # the error that stops the run is already on its way
            if not self._store.lost_to_deletion(exc):  # a deleted study takes no more tells
                _log.warning("told trials not written (the next run tells them again): %s", exc)

    def _withdraw_waiting(self) -> None:
        """On interrupt: trials not yet started never will; running ones stay re-attachable.

        With the broker away nothing can be withdrawn; the next run re-attaches all of them.
        """
        with contextlib.suppress(redis.RedisError, BrokerUnreachable):
            statuses = self.dispatcher.statuses(self.in_flight)
            waiting = [tid for tid, s in statuses.items() if s.phase is TaskPhase.WAITING]
            self.dispatcher.withdraw(waiting, self.spec.trial.queue)


def budget_for(spec: StudySpec, n_trials: int) -> Budget:
    """The spec's budgets, with `n_trials` (the spec's, or the command line's)."""
    study = spec.study
    return Budget(
        n_trials=n_trials,
        max_wall_s=study.max_wall_s,
        hard_wall=study.max_wall_hard,
        max_gpu_hours=study.max_gpu_hours,
        goal=study.goal,
        maximize=study.objective_directions[0] == "maximize",
        max_failed_trials=study.max_failed_trials,
    )


def _host_of(worker: str | None) -> str | None:
    """`gpu-node-3` from Celery's worker name `trialq-12@gpu-node-3`."""
    return worker.rsplit("@", 1)[-1] if worker else None


def _recorded_resends(record: TrialRecord) -> Resends:
    """The re-send counts a previous driver recorded; a record from before `retries` was kept
    counts every attempt that was not a preemption as a retry."""
    preemptions = record.preemptions or 0
    attempts = 1 if record.attempts is None else record.attempts
    retries = record.retries if record.retries is not None else attempts - 1 - preemptions
    return Resends(retries=retries, preemptions=preemptions)


def _failed(future: Future[None]) -> bool:
    return future.done() and future.exception() is not None
