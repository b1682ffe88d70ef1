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
import math
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import redis
from optuna.trial import FrozenTrial, TrialState

from trialq import logs
from trialq.driver._storage.attrs import set_user_attrs
from trialq.driver._storage.mirror import (
    annotate,
    finished_elsewhere,
    flush,
    flush_behind,
    persist,
    ping,
)
from trialq.driver.oom_constraint import OOM_CONSTRAINT, OomTelling, counted_state, oom_telling
from trialq.driver.outage import Outages
from trialq.driver.progress import Counts, ProgressSink
from trialq.driver.search_space import DefineSpace, load_search_space
from trialq.driver.spec import StudySpec
from trialq.driver.study import distributions
from trialq.driver.study_lock import StudyLock
from trialq.errors import BrokerUnreachable, Interrupted, SpecError
from trialq.wire.channel import Report, TrialAddress
from trialq.wire.dispatch import Dispatcher, TaskPhase, TaskStatus, TrialReports
from trialq.wire.failures import failure_line
from trialq.wire.messages import ARTIFACTS_ATTR_PREFIX, Outcome, TrialRequest, TrialResult
from trialq.wire.messages import checkpoint_key as new_checkpoint_key

FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
_STATE_OF = {Outcome.OK: TrialState.COMPLETE, Outcome.PRUNED: TrialState.PRUNED}
_log = logging.getLogger("trialq.driver")  # the name log lines show; kept when the module moved


@dataclass
class InFlight:
    """A trial the driver has sent and not yet told."""

    trial: optuna.Trial
    request: TrialRequest
    task_id: str
    reports_seen: str = "0"
    prune_requested_at: float | None = None
    terminated: bool = False
    unknown_checks: int = 0

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
    search_paths: tuple[str, ...] = ()
    clock: Callable[[], float] = time.monotonic


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
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    recording: list[Recording] = field(default_factory=list)
    """Trials whose record is on its way to the database, in the order they were asked."""
    unsent: list[tuple[optuna.Trial, TrialRequest]] = field(default_factory=list)
    """Asked trials whose sending failed (broker away); sent before any new one."""
    counts: Counts = field(default_factory=Counts)
    _last_lost_check: float = -math.inf
    _last_outside_check: float = -math.inf
    _written: Future[None] | None = None
    """The last step's commit: its failure is how a storage outage shows."""
    channel: TrialReports | None = field(init=False, default=None)
    """Where trials in flight report, as the dispatcher says (`Dispatcher.reports`)."""

    def __post_init__(self) -> None:
        self.channel = self.dispatcher.reports()
        if self.define_space is None:
            self.define_space = load_search_space(self.spec)

    def run(self, n_trials: int) -> None:
        """Ask, send, collect and tell until `n_trials` trials have finished."""
        self._count_finished()
        self._reattach()
        self._written = flush_behind(self.study)
        outages = Outages(self.options.outage_limit_s, self.options.clock)
        try:
            while self._step(n_trials, outages):
                self._pause(self.options.poll_interval_s, outages)
            self._write_all(outages)
        except KeyboardInterrupt:
            self._withdraw_waiting()
            raise Interrupted("interrupted: queued trials withdrawn; rerun to resume") from None
        except SpecError:
            self._withdraw_waiting()
            raise
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
            self._check_outside()
            self._send_recorded()
            more = self._fill(n_trials)
            self._relay_reports()
        self._written = flush_behind(self.study)
        for recording in self.recording:  # a record whose commit failed waits for this one
            if _failed(recording.recorded):
                recording.recorded = self._written
        self.progress.update(self.counts, self._best_value(), self._outstanding)
        return bool(more or self._outstanding)

    def _pause(self, seconds: float, outages: Outages) -> None:
        """Wait for the next pass, sending each trial the moment its record is written."""
        deadline = time.monotonic() + seconds
        while self.recording and time.monotonic() < deadline:
            with outages.tolerated():
                if not self._send_recorded(deadline):
                    break
        time.sleep(max(0.0, deadline - time.monotonic()))

    def _write_all(self, outages: Outages) -> None:
        """The run is done once every tell is in the database, outage or not."""
        written = False
        while not written:
            with outages.tolerated():
                flush(self.study)
                written = True

    def _check_storage(self, outages: Outages) -> None:
        """Raise the last commit's error, if it failed; while the storage is known to be
        away, ask it until it answers (a pass may have nothing to write)."""
        if self._written is not None and self._written.done():
            self._written.result()
        if outages.away("storage"):
            ping(self.study)
            outages.recovered("storage")

    @property
    def _outstanding(self) -> int:
        """Trials asked and not yet told: sent, or on their way to being sent."""
        return len(self.in_flight) + len(self.recording)

    # --- sending -----------------------------------------------------------------------

    def _fill(self, n_trials: int) -> bool:
        """Send new trials while there is room; True while more remain to be sent."""
        while self.unsent:
            trial, unsent = self.unsent.pop(0)
            self._send(trial, unsent.attempt, unsent.checkpoint_key, unsent.preemptions)
        while (
            self._outstanding < self.options.max_in_flight
            and self.counts.finished + self._outstanding < n_trials
        ):
            self._send(self._ask(), attempt=1)
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
            memory_limit_mb=self.spec.trial.memory_limit_mb,
            search_paths=self.options.search_paths,
            checkpoint_key=checkpoint_key,
            keep_checkpoints=self.spec.trial.keep_checkpoints,
            preemptions=preemptions,
        )

    def _send(
        self,
        trial: optuna.Trial,
        attempt: int,
        checkpoint_key: str | None = None,
        preemptions: int = 0,
    ) -> None:
        """Record the attempt in the storage, and send it once the record is written: a trial
        in a queue always has its params, task id and checkpoint key in the database, so a
        restarted driver finds it and its next attempt finds the same checkpoint folder."""
        key = checkpoint_key or new_checkpoint_key(self.study.study_name, trial.number)
        request = self._request(trial, attempt, key, preemptions)
        task_id = str(uuid.uuid4())
        set_user_attrs(
            trial,
            {
                "task_id": task_id,
                "attempts": attempt,
                "checkpoint_key": key,
                "preemptions": preemptions,
            },
        )
        self.recording.append(Recording(trial, request, task_id, persist(trial)))
        self._send_recorded()

    def _send_recorded(self, deadline: float | None = None) -> bool:
        """Send the trials whose record is written, in the order they were asked; with a
        `deadline` (`time.monotonic`), wait for each until then. False where the head's commit
        failed: it waits for the next step's commit, whose outcome the step checks."""
        while self.recording:
            head = self.recording[0]
            wait_s = 0.0 if deadline is None else max(0.0, deadline - time.monotonic())
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
        trial, request, task_id = recorded.trial, recorded.request, recorded.task_id
        try:
            self.dispatcher.submit(
                request, self.spec.trial.queue, self.spec.trial.hard_limit_s, task_id
            )
        except BaseException:
            self.unsent.append((trial, request))
            raise
        self.in_flight[task_id] = InFlight(trial, request, task_id)
        _log.info("sent task_id=%s params=%s", task_id, request.params, extra=logs.fields(request))

    def _reattach(self) -> None:
        """Take back trials a previous driver left RUNNING: wait for them or resend them.

        A trial is persisted with its params and task id in one transaction before it is
        sent, so one with neither was asked and never sent: it ends as failed, with a note,
        and a fresh trial takes its place.
        """
        for frozen in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial = optuna.Trial(self.study, frozen._trial_id)
            task_id = frozen.user_attrs.get("task_id")
            attempt = int(frozen.user_attrs.get("attempts", 1))
            key = frozen.user_attrs.get("checkpoint_key")
            preemptions = int(frozen.user_attrs.get("preemptions", 0))
            if task_id is None and not frozen.params:
                note = "never sent: the previous driver stopped between asking and sending it"
                set_user_attrs(trial, {"outcome": Outcome.ERROR.value, "error": note})
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                self.counts.record(TrialState.FAIL)
            elif task_id is None:  # an older driver recorded ids after sending
                self._send(trial, attempt, key, preemptions)
            else:
                request = self._request(trial, attempt, key, preemptions)
                self.in_flight[task_id] = InFlight(trial, request, task_id)

    # --- collecting ----------------------------------------------------------------------

    def _collect(self) -> None:
        statuses = self.dispatcher.statuses(self.in_flight)
        check_lost = self._lost_check_due()
        pending: set[str] | None = None
        for task_id, status in statuses.items():
            entry = self.in_flight[task_id]
            if status.phase is TaskPhase.FINISHED:
                assert status.result is not None
                if status.result.device_refused:  # not run: the worker's device was not clean
                    self._lost(entry, status.result.error or "the worker's device was not clean")
                elif status.result.outcome is Outcome.PREEMPTED:
                    self._preempted(entry, status.result)
                else:
                    self._finish(entry, status.result)
            elif status.phase is TaskPhase.FAILED:
                self._fail_from_outside(entry, status)
            elif status.phase is TaskPhase.RUNNING:
                self._check_running(entry, status)
            elif check_lost:
                if pending is None:
                    pending = self.dispatcher.pending_ids(self.spec.trial.queue)
                self._check_waiting(entry, pending)

    def _lost_check_due(self) -> bool:
        now = self.options.clock()
        if now - self._last_lost_check < self.options.lost_check_interval_s:
            return False
        self._last_lost_check = now
        return True

    def _check_outside(self) -> None:
        """Every few seconds: check this driver still holds its study, and ask the storage
        whether someone else finished a trial in flight (optuna-dashboard's Fail button is
        "stop this trial now"): their state stands, the trial's process is killed, and it is
        not retried."""
        now = self.options.clock()
        if now - self._last_outside_check < self.options.outside_check_interval_s:
            return
        self._last_outside_check = now
        if self.study_lock is not None:
            self.study_lock.ensure_held()
        by_trial = {entry.trial._trial_id: entry for entry in self.in_flight.values()}
        for frozen in finished_elsewhere(self.study, by_trial):
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
        annotate(
            entry.trial,
            {
                "outcome": Outcome.STOPPED.value,
                "error": note,
                "attempts": entry.request.attempt,
                "task_id": entry.task_id,
            },
        )
        self.counts.record(counted_state(frozen))
        _log.warning("trial #%d %s", frozen.number, note, extra=logs.fields(entry.request))

    def _check_running(self, entry: InFlight, status: TaskStatus) -> None:
        entry.unknown_checks = 0
        if self._prune_overdue(entry):
            self.dispatcher.terminate(entry.task_id)
            entry.terminated = True
        elif status.worker and not self.dispatcher.worker_alive(status.worker):
            self._lost(entry, f"worker {status.worker} stopped beating")

    def _check_waiting(self, entry: InFlight, pending: set[str]) -> None:
        """A task neither queued, reserved nor started on two checks in a row was lost."""
        if entry.task_id in pending:
            entry.unknown_checks = 0
            return
        entry.unknown_checks += 1
        if entry.unknown_checks >= 2:
            self._resend(entry, attempt=entry.request.attempt)

    def _fail_from_outside(self, entry: InFlight, status: TaskStatus) -> None:
        """The process ended without a result: killed, out of time, or stopped by us."""
        if entry.terminated:
            note = "stopped from outside: the trial did not honour should_prune() in time"
            self._finish(entry, self._synthetic(entry, Outcome.PRUNED, note))
        elif status.failure is Outcome.WORKER_LOST:
            self._lost(entry, status.detail)
        else:
            outcome = status.failure or Outcome.ERROR
            self._finish(entry, self._synthetic(entry, outcome, status.detail))

    def _lost(self, entry: InFlight, detail: str) -> None:
        """Resend the same trial (same number and params) or give up after max_retries.

        A process that killed itself over `memory_limit_mb` is not lost but out of memory; one
        lost after its worker's stop notice (SIGTERM, then killed) was preempted.
        """
        rss = self.channel.memory_exceeded(entry.address) if self.channel else None
        retries = entry.request.attempt - 1 - entry.request.preemptions
        if rss is not None:
            limit = f"memory_limit_mb = {self.spec.trial.memory_limit_mb}"
            result = self._synthetic(entry, Outcome.OOM, f"killed at {rss} bytes RSS, over {limit}")
            self._finish(entry, result.model_copy(update={"peak_rss_bytes": rss}))
        elif self.channel is not None and self.channel.stop_requested(entry.address):
            note = f"killed after its stop notice ({detail})"
            self._preempted(entry, self._synthetic(entry, Outcome.PREEMPTED, note))
        elif retries < self.spec.trial.max_retries:
            self._forget_reports(entry)
            _log.info("retried after: %s", detail, extra=logs.fields(entry.request))
            self._resend(entry, attempt=entry.request.attempt + 1)
        else:
            self._finish(entry, self._synthetic(entry, Outcome.WORKER_LOST, detail))

    def _preempted(self, entry: InFlight, result: TrialResult) -> None:
        """Re-send a preempted trial (same number, params and checkpoint folder) as its next
        attempt, or tell it FAIL past `max_preemptions`."""
        if entry.request.preemptions < self.spec.trial.max_preemptions:
            _link_artifacts(entry.trial, result)  # what the cut-short attempt saved stays
            self._forget_reports(entry)
            _log.info("re-sent after preemption: %s", result.error or "",
                      extra=logs.fields(entry.request))  # fmt: skip
            self._resend(entry, entry.request.attempt + 1, entry.request.preemptions + 1)
        else:
            given_up = f"gave up after {entry.request.preemptions} preemptions"
            error = f"{result.error or 'preempted'}; {given_up}"
            self._finish(entry, result.model_copy(update={"error": error}))

    def _resend(self, entry: InFlight, attempt: int, preemptions: int | None = None) -> None:
        """Withdraw the old task for good, then send the same trial again."""
        self.dispatcher.withdraw([entry.task_id], self.spec.trial.queue)
        del self.in_flight[entry.task_id]
        if preemptions is None:
            preemptions = entry.request.preemptions
        self._send(entry.trial, attempt, entry.request.checkpoint_key, preemptions)

    def _synthetic(self, entry: InFlight, outcome: Outcome, detail: str) -> TrialResult:
        return TrialResult(
            study=entry.request.study,
            number=entry.request.number,
            attempt=entry.request.attempt,
            outcome=outcome,
            error=detail,
        )

    # --- telling -------------------------------------------------------------------------

    def _finish(self, entry: InFlight, result: TrialResult) -> None:
        """Work out the objective, then tell; a spec that cannot pick one stops the run."""
        self._drain_reports(entry)
        del self.in_flight[entry.task_id]
        try:
            result, values = self._objective(result)
        except SpecError as exc:
            error = {"outcome": Outcome.ERROR, "error": str(exc)}
            self._tell(entry, result.model_copy(update=error), None)
            raise
        self._tell(entry, result, values)

    def _tell(self, entry: InFlight, result: TrialResult, values: list[float] | None) -> None:
        """Record the result on the trial and tell Optuna, once."""
        attrs = {
            **result.user_attrs(),
            "attempts": entry.request.attempt,
            "task_id": entry.task_id,
            "preemptions": entry.request.preemptions,
        }
        set_user_attrs(entry.trial, attrs)
        _link_artifacts(entry.trial, result)
        if not result.checkpoint_removed:
            self._orphan_checkpoint(entry)
        state = _STATE_OF.get(result.outcome, TrialState.FAIL)
        self.counts.record(state)
        told = self._oom_telling() if result.outcome is Outcome.OOM else None
        if told is not None:
            # A FAIL trial teaches no sampler anything; see trialq.driver.oom_constraint.
            entry.trial.set_constraint(OOM_CONSTRAINT, 1.0)
            state, values = told.state, told.values
        self.study.tell(
            entry.trial,
            values=values if state is TrialState.COMPLETE else None,
            state=state,
            skip_if_finished=True,
        )
        self._forget_reports(entry)
        _log.info("told state=%s outcome=%s", state.name, result.outcome, extra=logs.fields(result))
        if result.outcome not in _STATE_OF:  # failed, or out of memory however it was told
            line = failure_line(entry.request.number, result.outcome, result.error)
            self.progress.trial_failed(line)

    def _oom_telling(self) -> OomTelling | None:
        study = self.spec.study
        if not study.oom_as_constraint:
            return None
        return oom_telling(study.sampler, study.objective_directions)

    def _objective(self, result: TrialResult) -> tuple[TrialResult, list[float] | None]:
        """The objective values of an ok result, or the result turned into an error."""
        if result.outcome is not Outcome.OK:
            return result, None
        try:
            values = objective_values(result.metrics, self.spec.study.objective_metrics)
        except KeyError as exc:
            error = str(exc.args[0])
            return result.model_copy(update={"outcome": Outcome.ERROR, "error": error}), None
        if not all(math.isfinite(v) for v in values):
            error = f"objective is not finite: {values}"
            return result.model_copy(update={"outcome": Outcome.ERROR, "error": error}), None
        return result, values

    def _orphan_checkpoint(self, entry: InFlight) -> None:
        """The trial is over and no process of it removed its checkpoint folder (it was
        killed, or gave up): ask a later trial process to (`trialq.trial.checkpoints`)."""
        key = entry.request.checkpoint_key
        if key is None or self.spec.trial.keep_checkpoints or self.channel is None:
            return
        with contextlib.suppress(redis.RedisError):
            self.channel.orphan_checkpoint(key)

    def _forget_reports(self, entry: InFlight) -> None:
        if self.channel is not None:
            self.channel.forget(entry.address)

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
        found = self.channel.read_new({entry.address: entry.reports_seen})
        self._record_reports(entry, found.get(entry.address, []))

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

    @staticmethod
    def _record_reports(entry: InFlight, reports: list[Report]) -> None:
        for report in reports:
            _record_intermediate(entry.trial, report.step, report.value)
            entry.reports_seen = report.stream_id

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
        tells them again."""
        try:
            flush(self.study)
        except Exception as exc:  # the error that stops the run is already on its way
            _log.warning("told trials not written (the next run tells them again): %s", exc)

    def _withdraw_waiting(self) -> None:
        """On interrupt: trials not yet started never will; running ones stay re-attachable.

        With the broker away nothing can be withdrawn; the next run re-attaches all of them.
        """
        with contextlib.suppress(redis.RedisError, BrokerUnreachable):
            statuses = self.dispatcher.statuses(self.in_flight)
            waiting = [tid for tid, s in statuses.items() if s.phase is TaskPhase.WAITING]
            self.dispatcher.withdraw(waiting, self.spec.trial.queue)


def _record_intermediate(trial: optuna.Trial, step: int, value: float) -> None:
    """`trial.report`, except that a retried attempt's value replaces an earlier attempt's
    at the same step (Optuna would keep the first and ignore the new one)."""
    cached = trial._cached_frozen_trial.intermediate_values
    if step in cached:
        trial.storage.set_trial_intermediate_value(trial._trial_id, step, value)
        cached[step] = value
    else:
        trial.report(value, step)


def _link_artifacts(trial: optuna.Trial, result: TrialResult) -> None:
    """Link the files the attempt stored to the trial, with the system attr that
    `optuna.artifacts.upload_artifact` writes (the worker wrote the files themselves)."""
    for meta in result.artifacts:
        key = ARTIFACTS_ATTR_PREFIX + meta.artifact_id
        trial.storage.set_trial_system_attr(trial._trial_id, key, meta.model_dump_json())


def _failed(future: Future[None]) -> bool:
    return future.done() and future.exception() is not None


def objective_values(metrics: dict[str, float], names: tuple[str, ...] | None) -> list[float]:
    """Pick the objectives out of a trial's metrics (raise KeyError naming what is missing)."""
    if set(metrics) == {"value"} and (names is None or len(names) == 1):
        return [metrics["value"]]  # the trial returned a bare number
    if names is None:
        if len(metrics) == 1:
            return list(metrics.values())
        raise SpecError(
            f"the trial returned several metrics ({', '.join(sorted(metrics))}) "
            "but the spec names none: set study.metric"
        )
    missing = [name for name in names if name not in metrics]
    if missing:
        raise KeyError(
            f"metric {', '.join(missing)} not returned (got {', '.join(sorted(metrics))})"
        )
    return [metrics[name] for name in names]


def search_paths_for(spec: StudySpec) -> tuple[str, ...]:
    """Folders a local worker needs on sys.path: the spec's and the current directory."""
    return (str(spec.directory), str(Path.cwd()))
