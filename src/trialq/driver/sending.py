"""What is in flight, and sending it: recording each new trial (`trialq.driver.new_trials`)
before it is sent, sending it once its record is written, re-sending, and taking back what
has not started.

A trial in a queue always has its params, task id and checkpoint key in the database, so a
restarted driver finds it (`trialq.driver.fate.reattach`) and its next attempt finds the same
checkpoint folder.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import optuna
from optuna.distributions import distribution_to_json

from trialq import logs
from trialq.driver._storage.store import TrialStore
from trialq.driver.fate import Resends
from trialq.driver.in_flight import InFlight, Recording
from trialq.driver.new_trials import NewTrials
from trialq.driver.search_space import DefineSpace
from trialq.driver.study import study_key
from trialq.errors import BrokerError
from trialq.spec import StudySpec
from trialq.tracking.mlflow_runs import tracking_uri
from trialq.wire.dispatch import Dispatcher, TaskPhase
from trialq.wire.messages import MlflowTarget, TrialRequest
from trialq.wire.messages import checkpoint_key as new_checkpoint_key
from trialq.wire.record import TrialRecord

_log = logging.getLogger("trialq.driver")  # the loop's name: log lines read as before


class Sender:
    """The trials in flight (sent, not told) and those on their way to being sent."""

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        dispatcher: Dispatcher,
        store: TrialStore,
        clock: Callable[[], float],
        define_space: DefineSpace | None,
    ) -> None:
        self._spec, self._study, self._dispatcher = spec, study, dispatcher
        self._store, self._clock = store, clock
        self._mlflow = mlflow_target(spec)
        self._study_key = study_key(study)
        self._in_flight: dict[str, InFlight] = {}
        self.recording: list[Recording] = []
        """Trials whose record is on its way to the database, in the order they were asked."""
        self.unsent: list[Recording] = []
        """Asked trials whose sending failed (broker away); sent before any new one."""
        self.new_trials = NewTrials(spec, study, store, define_space)
        """Where the trials it sends come from (asked ahead, drawn by ask processes, or
        asked here)."""

    @property
    def in_flight(self) -> Mapping[str, InFlight]:
        """The trials sent and not yet told, by task id: added and removed here alone."""
        return self._in_flight

    @property
    def outstanding(self) -> int:
        """Trials asked and not yet told: sent, or on their way to being sent."""
        return len(self._in_flight) + len(self.recording)

    def fill(self, n_trials: int, finished: int, max_in_flight: int) -> bool:
        """Send what failed to go, then new trials while there is room; True while more
        remain to be sent."""
        while self.unsent:
            unsent = self.unsent.pop(0)
            request = unsent.request
            self.send(unsent.trial, request.attempt, request.checkpoint_key, unsent.resends)
        while self.outstanding < max_in_flight and finished + self.outstanding < n_trials:
            self.send(self.new_trials.next(), 1, None, Resends())
        return finished + self.outstanding < n_trials

    def settled(self, entry: InFlight) -> None:
        """`entry`'s attempt is over (told, or finished from outside): no longer in flight."""
        del self._in_flight[entry.task_id]

    def request(
        self, trial: optuna.Trial, attempt: int, checkpoint_key: str | None, preemptions: int
    ) -> TrialRequest:
        """The message that runs one attempt of `trial`."""
        trial_spec = self._spec.trial
        return TrialRequest(
            study=self._study.study_name,
            number=trial.number,
            attempt=attempt,
            params=dict(trial.params),
            entrypoint=trial_spec.entrypoint.resolved(self._spec.directory),
            timeout_s=trial_spec.timeout_s,
            hard_limit_s=trial_spec.hard_limit_s,
            memory_limit_mb=trial_spec.memory_limit_mb,
            checkpoint_key=checkpoint_key,
            keep_checkpoints=trial_spec.keep_checkpoints,
            preemptions=preemptions,
            framework=trial_spec.framework,
            cpus=trial_spec.cpus,
            mlflow=self._mlflow,
            study_key=self._study_key,
            suggests=self._spec.trial_suggests,
            distributions=carried_distributions(trial) if self._spec.trial_suggests else {},
            answers=True,
            code=self._spec.carried_code,
        )

    def send(
        self, trial: optuna.Trial, attempt: int, checkpoint_key: str | None, resends: Resends
    ) -> None:
        """Record the attempt in the storage, and send it once the record is written."""
        key = checkpoint_key or new_checkpoint_key(self._study.study_name, trial.number)
        request = self.request(trial, attempt, key, resends.preemptions)
        task_id = str(uuid.uuid4())
        record = TrialRecord(
            task_id=task_id, attempts=attempt, checkpoint_key=key,
            retries=resends.retries, preemptions=resends.preemptions,
        )  # fmt: skip
        self._store.set_attrs(trial, record.attrs())
        written = self._store.flush_behind()
        self.recording.append(Recording(trial, request, task_id, resends, written))
        self.send_recorded()

    def send_recorded(self, deadline: float | None = None) -> bool:
        """Send the trials whose record is written, in the order they were asked; with a
        `deadline` (on the loop's clock), wait for each until then. False where the head's commit
        failed: it waits for the next step's commit, whose outcome the step checks."""
        while self.recording:
            head = self.recording[0]
            wait_s = 0.0 if deadline is None else max(0.0, deadline - self._clock())
            try:
                head.recorded.result(timeout=wait_s)
            except TimeoutError:
                return True
            except Exception:
                return False
            self.recording.pop(0)
            self._submit(head)
        return True

    def rerecord_failed(self, written: Future[None]) -> None:
        """A record whose commit failed waits for the step's next commit, `written`."""
        for recording in self.recording:
            future = recording.recorded
            if future.done() and future.exception() is not None:
                recording.recorded = written

    def _submit(self, recorded: Recording) -> None:
        request, task_id = recorded.request, recorded.task_id
        try:
            self._dispatcher.submit(request, self._spec.trial.queue, task_id=task_id)
        except BaseException:
            self.unsent.append(recorded)
            raise
        self._in_flight[task_id] = InFlight(recorded.trial, request, task_id, recorded.resends)
        _log.info("sent task_id=%s params=%s", task_id, request.params, extra=logs.fields(request))

    def follow(
        self, trial: optuna.Trial, task_id: str, attempt: int, key: str | None, resends: Resends
    ) -> None:
        """Take a task a previous driver sent as one in flight."""
        request = self.request(trial, attempt, key, resends.preemptions)
        self._in_flight[task_id] = InFlight(trial, request, task_id, resends)

    def resend(self, entry: InFlight, new_attempt: bool, resends: Resends) -> None:
        """Withdraw the old task for good, then send the same trial again."""
        self._dispatcher.withdraw([entry.task_id], self._spec.trial.queue)
        del self._in_flight[entry.task_id]
        attempt = entry.request.attempt + (1 if new_attempt else 0)
        self.send(entry.trial, attempt, entry.request.checkpoint_key, resends)

    def withdraw_waiting(self) -> bool:
        """On interrupt: trials not yet started never will; running ones stay re-attachable.
        Whether that was done: with the broker away nothing can be withdrawn (False; a
        worker may still run them, and the next run re-attaches all of them).
        """
        try:
            statuses = self._dispatcher.statuses(self._in_flight)
            waiting = [tid for tid, s in statuses.items() if s.phase is TaskPhase.WAITING]
            self._dispatcher.withdraw(waiting, self._spec.trial.queue)
        except BrokerError:
            return False
        return True

    def leave_in_flight(self) -> None:
        """Stop every trial in flight and leave it RUNNING in the study, for the next run to
        send again (a withdrawn or killed attempt uses no retry)."""
        self.withdraw_waiting()
        for task_id in list(self._in_flight):
            self._dispatcher.terminate(task_id)
        self._in_flight.clear()


def mlflow_target(spec: StudySpec) -> MlflowTarget | None:
    """What a trial process needs to find its MLflow run: the store the driver's tracker
    writes to (a relative path the spec folder's) and its experiment; None without
    `[tracking.mlflow]`."""
    config = spec.tracking.mlflow
    if config is None:
        return None
    uri = tracking_uri(config, spec.directory)
    return MlflowTarget(tracking_uri=uri, experiment=config.experiment or spec.study.name)


def carried_distributions(trial: optuna.Trial) -> dict[str, dict[str, Any]]:
    """The distribution of each param a trial carries, as Optuna's JSON: a trial that
    suggests one of them with the same distribution needs no round trip."""
    return {
        name: json.loads(distribution_to_json(distribution))
        for name, distribution in trial.distributions.items()
    }
