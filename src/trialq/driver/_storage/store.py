"""The driver's one way into its study's storage: every write it makes, and when it is durable.

The driver is the single writer of its study's trials (docs/design.md). `TrialStore` is the
seam it writes through, handed to it as the dispatcher is: user attrs, intermediate values,
artifacts' links, tells, and the points at which all of that must be in the database. Its
two backends:

- `MirroredTrialStore`: trialq's `MirroredStorage` (`trialq.driver._storage.mirror`), what
  `submit-study` always opens. Writes wait in the copy and go in one transaction a step.
- `InMemoryTrialStore`: Optuna's in-memory storage, for the benchmarks that drive the loop on
  a virtual clock and need no database. Every write is durable at once.

`store_for` picks one from the study's storage; no caller asks which it has.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import optuna
import sqlalchemy
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from trialq.driver._storage.mirror import FLUSH_WAIT_S, MirroredStorage
from trialq.errors import StudyDeleted
from trialq.wire.messages import ARTIFACTS_ATTR_PREFIX, ArtifactMeta

LAST_WRITE_WAIT_S = 2.0
"""How long a run that is ending anyway (interrupted, or past its outage limit) waits for its
last commit; what is not written stays RUNNING with its task id, and the next run tells it."""


class TrialStore(ABC):
    """Every write the driver makes to the trials of `study`.

    Ownership: only the driver writes; a person may finish a RUNNING trial from outside, and
    `finished_elsewhere` is how the driver learns of it. A write is durable once the future of
    a later `flush_behind` is done, or once `flush` returns.
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    @abstractmethod
    def set_attrs(self, trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
        """User attrs on a trial not yet told, written together."""

    def told(self, trial: optuna.Trial) -> FrozenTrial:
        """The trial as the driver wrote it (from the driver's copy, not the database)."""
        return self.study._storage.get_trial(trial._trial_id)

    @abstractmethod
    def annotate(self, trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
        """User attrs on a trial however it ended (one finished from outside, too)."""

    @abstractmethod
    def finished_elsewhere(self, trial_ids: Iterable[int]) -> list[FrozenTrial]:
        """Of `trial_ids`, the trials another process finished."""

    @abstractmethod
    def flush_behind(self) -> Future[None]:
        """Everything written so far on its way to the database; done once durable."""

    @abstractmethod
    def flush(self, wait_s: float = FLUSH_WAIT_S) -> None:
        """Everything written so far durable now; `StorageUnreachable` if that takes longer
        than `wait_s` (the writes stay on their way)."""

    @abstractmethod
    def ping(self) -> None:
        """Raise while the database is away."""

    def record_intermediate(self, trial: optuna.Trial, step: int, value: float) -> None:
        """`trial.report`, except that a retried attempt's value replaces an earlier attempt's
        at the same step (Optuna would keep the first and ignore the new one)."""
        cached = trial._cached_frozen_trial.intermediate_values
        if step in cached:
            trial.storage.set_trial_intermediate_value(trial._trial_id, step, value)
            cached[step] = value
        else:
            trial.report(value, step)

    def record_intermediates(self, trial: optuna.Trial, values: Mapping[int, float]) -> None:
        """`record_intermediate` for each value, written together."""
        for step, value in values.items():
            self.record_intermediate(trial, step, value)

    def link_artifacts(self, trial: optuna.Trial, artifacts: Iterable[ArtifactMeta]) -> None:
        """Link files an attempt stored to the trial, with the system attr that
        `optuna.artifacts.upload_artifact` writes (the worker wrote the files themselves)."""
        for meta in artifacts:
            key = ARTIFACTS_ATTR_PREFIX + meta.artifact_id
            trial.storage.set_trial_system_attr(trial._trial_id, key, meta.model_dump_json())

    def set_study_attr(self, key: str, value: Any) -> None:
        """A user attr on the study itself (what ended the last run, say)."""
        self.study.set_user_attr(key, value)

    def lost_to_deletion(self, exc: Exception) -> bool:
        """Whether `exc`, raised by a write, is the study deleted from the storage by someone
        else (`optuna.delete_study`): a row the driver writes to is gone, and so is the study;
        or its storage itself deleted (`StudyDeleted`, a SQLite file)."""
        if isinstance(exc, StudyDeleted):
            return True
        if not isinstance(exc, KeyError | sqlalchemy.exc.IntegrityError):
            return False
        try:
            self.study._storage.get_study_id_from_name(self.study.study_name)
        except KeyError:
            return True
        except Exception:  # the storage away: no word on the study, the error stands
            return False
        return False

    def tell(self, trial: optuna.Trial, state: TrialState, values: Sequence[float] | None) -> None:
        """Tell Optuna the trial's end, once: a trial already finished stays as it is."""
        self.study.tell(trial, values=values, state=state, skip_if_finished=True)

    def enqueue(self, params: Mapping[str, Any]) -> None:
        """A trial of fixed `params` for the study's next ask, unless one was seen before."""
        self.study.enqueue_trial(dict(params), skip_if_exists=True)

    def set_constraint(self, trial: optuna.Trial, key: str, value: float) -> None:
        """A constraint on a trial not yet told (feasible at 0 or less), as Optuna's
        constrained samplers read it."""
        trial.set_constraint(key, value)

    def adopt(
        self, params: Mapping[str, Any], distributions: Mapping[str, BaseDistribution]
    ) -> optuna.Trial:
        """A new trial of the study with `params` drawn elsewhere (an ask process), as
        `study.ask` with them fixed would make it, without asking its sampler."""
        storage = self.study._storage
        trial_id = storage.create_new_trial(self.study._study_id)
        for name, value in params.items():
            distribution = distributions[name]
            internal = distribution.to_internal_repr(value)
            storage.set_trial_param(trial_id, name, internal, distribution)
        return optuna.Trial(self.study, trial_id)

    def give_back(self, trial: optuna.Trial) -> None:
        """A trial asked and never sent goes back to WAITING, its params kept: the study's
        next ask takes it (Optuna keeps a param a trial already has)."""
        self.study._storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)


class MirroredTrialStore(TrialStore):
    """Writes through trialq's `MirroredStorage`: batched, one transaction a step."""

    def __init__(self, study: optuna.Study, storage: MirroredStorage) -> None:
        super().__init__(study)
        self.storage = storage

    def set_attrs(self, trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
        if attrs:
            self.storage.set_trial_user_attrs(trial._trial_id, attrs)
            trial._cached_frozen_trial.user_attrs.update(attrs)

    def annotate(self, trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
        self.storage.annotate(trial._trial_id, attrs)

    def finished_elsewhere(self, trial_ids: Iterable[int]) -> list[FrozenTrial]:
        return self.storage.finished_elsewhere(trial_ids)

    def flush_behind(self) -> Future[None]:
        return self.storage.flush_behind()

    def flush(self, wait_s: float = FLUSH_WAIT_S) -> None:
        self.storage.flush(wait_s)

    def ping(self) -> None:
        self.storage.ping()

    def record_intermediates(self, trial: optuna.Trial, values: Mapping[int, float]) -> None:
        """One transaction for a relay's values, not one for each (Optuna's `report` checks
        nothing more for a float at an int step; a repeated step replaces the earlier one)."""
        if values:
            self.storage.set_trial_intermediate_values(trial._trial_id, values)
            trial._cached_frozen_trial.intermediate_values.update(values)


class InMemoryTrialStore(TrialStore):
    """Writes through Optuna's in-memory storage, where every write is durable at once."""

    def set_attrs(self, trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)

    def annotate(self, trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
        for key, value in attrs.items():  # a trial finished elsewhere takes no more writes
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                trial.storage.set_trial_user_attr(trial._trial_id, key, value)

    def finished_elsewhere(self, trial_ids: Iterable[int]) -> list[FrozenTrial]:
        trials = [self.study._storage.get_trial(trial_id) for trial_id in trial_ids]
        return [trial for trial in trials if trial.state.is_finished()]

    def flush_behind(self) -> Future[None]:
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def flush(self, wait_s: float = FLUSH_WAIT_S) -> None:
        """Nothing waits: every write went in as it was made."""

    def ping(self) -> None:
        """Memory is never away."""


def store_for(study: optuna.Study) -> TrialStore:
    """The store for the study's storage: trialq's mirror, or Optuna's in-memory storage."""
    storage = study._storage
    if isinstance(storage, MirroredStorage):
        return MirroredTrialStore(study, storage)
    if isinstance(storage, optuna.storages.InMemoryStorage):
        return InMemoryTrialStore(study)
    raise TypeError(
        f"the driver writes through trialq's mirrored RDB storage or Optuna's in-memory one, "
        f"not {type(storage).__name__} (open the study with trialq.driver.study.open_study)"
    )
