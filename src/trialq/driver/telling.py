"""Telling: recording a trial's end on it and telling Optuna, once; what is told feeds the
books (`trialq.driver.ledger`), the streak of same failures (`trialq.driver.failure_streak`)
and the progress shown. What to tell is the fate rule's (`trialq.driver.fate`); this does it.
"""

from __future__ import annotations

import logging

import optuna
from optuna.trial import FrozenTrial, TrialState

from trialq import logs
from trialq.driver import fate
from trialq.driver._storage.store import TrialStore
from trialq.driver.failure_streak import FailureStreak
from trialq.driver.fate import Stopped, Tell
from trialq.driver.in_flight import InFlight
from trialq.driver.ledger import Ledger
from trialq.driver.progress import ProgressSink
from trialq.driver.relay import ReportRelay
from trialq.driver.sampling.oom_constraint import (
    OOM_CONSTRAINT,
    OomTelling,
    oom_telling,
    sampler_kind,
)
from trialq.oom_stand_ins import has_stand_in_values
from trialq.spec import StudySpec
from trialq.tracking import ToldTrial, Tracking
from trialq.wire.failures import failure_line
from trialq.wire.messages import Outcome
from trialq.wire.record import TrialRecord

_log = logging.getLogger("trialq.driver")  # the loop's name: log lines read as before


class Teller:
    """Tells trials and keeps what telling them taught: the books, the failure streak."""

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        store: TrialStore,
        relay: ReportRelay,
        ledger: Ledger,
        progress: ProgressSink,
        tracking: Tracking | None = None,
    ) -> None:
        self._spec, self._study, self._store = spec, study, store
        self._relay, self._ledger, self._progress = relay, ledger, progress
        self._tracking = tracking or Tracking(trackers=())
        self._streak = FailureStreak(spec.study.max_failures_in_a_row)
        self._gpus = int(getattr(spec.trial, "gpus", 1))
        self.stop_reason: str | None = None
        """Why failing trials stop the run, once they do (`FailureStreak`)."""

    def tell(self, entry: InFlight, verdict: Tell) -> None:
        """Record the result on the trial and tell Optuna, once, as the verdict says."""
        result, state = verdict.result, verdict.state
        if result.worker_pid is None:  # no process's own result: it measured nothing
            result = result.model_copy(update={"duration_s": entry.ran_for_s()})
        record = TrialRecord.told(
            result, task_id=entry.task_id, attempts=entry.request.attempt,
            retries=entry.resends.retries, preemptions=entry.resends.preemptions, gpus=self._gpus,
            log_file=entry.log_file,
        )  # fmt: skip
        self._store.set_attrs(entry.trial, {**result.told_user_attrs(), **record.attrs()})
        self._store.link_artifacts(entry.trial, result.artifacts)
        if result.reports_dropped:
            _log.warning("trial #%d: %d of its reports were dropped (docs/telemetry.md, "
                         "the bound on reports)", entry.request.number, result.reports_dropped,
                         extra=logs.fields(result))  # fmt: skip
        if not result.checkpoint_removed:
            self.orphan_checkpoint(entry)
        self._ledger.record(fate.told_state(result.outcome), record)
        if verdict.constrained:
            self._store.set_constraint(entry.trial, OOM_CONSTRAINT, 1.0)
        self._store.tell(entry.trial, state, verdict.values)
        self._ledger.told(entry.request.number, state, verdict.values, not verdict.constrained)
        if self._tracking.active:
            self._tracking.told(told_trial(self._store.told(entry.trial), record))
        self._relay.forget(entry)
        _log.info("told state=%s outcome=%s", state.name, result.outcome, extra=logs.fields(result))
        if not result.outcome.succeeded:  # failed, or out of memory however it was told
            line = failure_line(entry.request.number, result.outcome, result.error)
            self._progress.trial_failed(line)
        self.saw(result.outcome, result.error)

    def stopped(self, entry: InFlight, verdict: Stopped) -> None:
        """Note on a trial someone else finished what became of it (its state stands)."""
        self._relay.forget(entry)
        self.orphan_checkpoint(entry)
        record = TrialRecord(
            outcome=verdict.outcome,
            error=verdict.note,
            attempts=entry.request.attempt,
            task_id=entry.task_id,
            duration_s=entry.ran_for_s(),
            worker_host=entry.worker_host,
        )
        self._store.annotate(entry.trial, record.attrs())
        self._ledger.record(verdict.counted_as)
        _log.warning(
            "trial #%d %s", entry.request.number, verdict.note, extra=logs.fields(entry.request)
        )

    def abandon(self, trial: optuna.Trial, verdict: fate.Abandon) -> None:
        """Fail a trial a previous driver asked and never sent."""
        never_sent = TrialRecord(outcome=Outcome.ERROR, error=verdict.note)
        self._store.set_attrs(trial, never_sent.attrs())
        self._store.tell(trial, TrialState.FAIL, None)
        self._ledger.record(TrialState.FAIL)

    def saw(self, outcome: Outcome, error: str | None) -> None:
        """Keep the streak of same failures; the first reason to stop stands."""
        reason = self._streak.saw(outcome, error)
        if reason is not None and self.stop_reason is None:
            self.stop_reason = reason

    def oom_telling(self) -> OomTelling | None:
        """How an out-of-memory trial is told now (`[study] oom_as_constraint`), from the
        trials that really completed; None: told FAIL."""
        study = self._spec.study
        if not study.oom_as_constraint:
            return None
        complete = self._study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        seen = [t.values for t in complete if not has_stand_in_values(t)]
        return oom_telling(sampler_kind(self._study.sampler), study.objective_directions, seen)

    def orphan_checkpoint(self, entry: InFlight) -> None:
        """The trial is over and no process of it removed its checkpoint folder (it was
        killed, or gave up): ask a later trial process to (`trialq.trial.checkpoints`)."""
        key = entry.request.checkpoint_key
        if key is not None and not self._spec.trial.keep_checkpoints:
            self._relay.orphan_checkpoint(key)


def told_trial(trial: FrozenTrial, record: TrialRecord) -> ToldTrial:
    """What the trackers are given of a told trial: the record the driver wrote, whole."""
    return ToldTrial(
        number=trial.number,
        state=trial.state.name,
        params=dict(trial.params),
        values=tuple(trial.values) if trial.values is not None else None,
        intermediate=dict(trial.intermediate_values),
        record=record,
        started=trial.datetime_start,
        ended=trial.datetime_complete,
    )
