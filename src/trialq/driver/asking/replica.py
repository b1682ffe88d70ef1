"""An ask process's copy of the study: the driver's trials as they change, and this process's
own asks, each running in the copy until the driver says it is done with it.

The copy is an Optuna in-memory study with the spec's own sampler (`make_sampler`), so an
ask here is the ask the driver would make: TPE with its constant liar counts every trial in
flight (the driver's, and this process's asks not yet adopted), and `DistinctFromRunning`
keeps off their params. Its trial numbers are its own (its asks sit between the driver's
trials); only the order matters to the sampler. The seed is this process's own, so two ask
processes never draw the same sequence.
"""

from __future__ import annotations

from collections.abc import Iterable

import optuna
from optuna.storages import InMemoryStorage
from optuna.trial import FrozenTrial, TrialState

from trialq.driver.asking.protocol import Asked
from trialq.driver.sampling.history import KEPT_BEST, KEPT_RECENT, TrialIndex
from trialq.driver.search_space import ask_new, load_search_space
from trialq.driver.study import make_sampler
from trialq.spec import StudySpec

REBUILD_PAST = 4 * (KEPT_BEST + KEPT_RECENT)
"""Trials in the copy past which it is made again from what TPE reads (`Replica._rebuild`)."""


class Replica:
    """The study as one ask process's sampler sees it."""

    def __init__(self, spec: StudySpec, seed: int | None, trials: Iterable[FrozenTrial]) -> None:
        self._spec = _seeded(spec, seed)
        self._define_space = load_search_space(spec)
        self._rebuilds = 0
        self.study = optuna.create_study(
            study_name="copy-0",
            storage=InMemoryStorage(),
            sampler=make_sampler(self._spec),
            directions=list(spec.study.objective_directions),
        )
        self._ids: dict[int, int] = {}  # the driver's unfinished trials -> the copy's trial id
        self._asks: dict[int, int] = {}  # this process's ask id -> the copy's trial id
        self._next_ask = 0
        self.apply(trials, ())

    def apply(self, trials: Iterable[FrozenTrial], settled: Iterable[int]) -> None:
        """The driver's new and changed trials in; the asks it is done with out of the
        running (failed here: a sampler reads no failed trial)."""
        storage, study_id = self.study._storage, self.study._study_id
        for ask_id in settled:
            trial_id = self._asks.pop(ask_id, None)
            if trial_id is not None:
                storage.set_trial_state_values(trial_id, TrialState.FAIL)
        for trial in trials:
            trial_id = self._ids.pop(trial.number, None)
            if trial_id is None:
                trial_id = storage.create_new_trial(study_id, trial)
            else:
                _update(storage, trial_id, trial)
            if not trial.state.is_finished():  # a finished trial never changes again
                self._ids[trial.number] = trial_id
        if len(self.study.directions) == 1 and self._held() > REBUILD_PAST:
            self._rebuild()

    def _held(self) -> int:
        return self.study._storage.get_n_trials(self.study._study_id)

    def _rebuild(self) -> None:
        """The copy again, as a new study of the same storage holding only what TPE reads past
        its bound (`history.TrialIndex.kept`: the best, the latest, the unfinished), so an
        ask's cost stays flat: Optuna's in-memory storage scans every trial on each of the
        several reads an ask makes. A new study, not the old one trimmed: it has a
        new id, which the sampler's indexes of the old one (`BoundedTPE`,
        `DistinctFromRunning`) see, and its numbers start again from 0 in the same order."""
        old = self.study
        index = TrialIndex(old.directions, KEPT_BEST, KEPT_RECENT)
        index.refresh(old)
        storage, self._rebuilds = old._storage, self._rebuilds + 1
        name = f"copy-{self._rebuilds}"
        study_id = storage.create_new_study(old.directions, name)
        moved = {t._trial_id: storage.create_new_trial(study_id, t) for t in index.kept()}
        self._ids = {number: moved[i] for number, i in self._ids.items()}
        self._asks = {ask: moved[i] for ask, i in self._asks.items()}
        self.study = optuna.load_study(study_name=name, storage=storage, sampler=old.sampler)
        storage.delete_study(old._study_id)

    def ask(self) -> Asked:
        """Draw the next trial's params; the draw stays running here until settled."""
        trial = ask_new(self.study, self._spec, self._define_space)
        ask_id, self._next_ask = self._next_ask, self._next_ask + 1
        self._asks[ask_id] = trial._trial_id
        return Asked(ask_id, dict(trial.params), dict(trial.distributions))


def _update(storage: optuna.storages.BaseStorage, trial_id: int, trial: FrozenTrial) -> None:
    """A trial the copy holds unfinished, as the driver has it now."""
    held = storage.get_trial(trial_id)
    if held.state.is_finished():
        return
    for name, value in trial.params.items():
        if name not in held.params:
            distribution = trial.distributions[name]
            internal = distribution.to_internal_repr(value)
            storage.set_trial_param(trial_id, name, internal, distribution)
    for key, value in trial.system_attrs.items():
        storage.set_trial_system_attr(trial_id, key, value)
    if trial.state.is_finished():
        storage.set_trial_state_values(trial_id, trial.state, trial.values)


def _seeded(spec: StudySpec, seed: int | None) -> StudySpec:
    """`spec` with its sampler's seed set to `seed` (or left unset)."""
    args = {k: v for k, v in spec.study.sampler_args.items() if k != "seed"}
    if seed is not None:
        args["seed"] = seed
    study = spec.study.model_copy(update={"sampler_args": args})
    return spec.model_copy(update={"study": study})
