"""Where the driver's new trials come from: a trial asked ahead, a draw of the ask processes
(`trialq.driver.asking`), or the driver's own ask of the study, in that order; and what
becomes of those not sent when the run ends."""

from __future__ import annotations

import logging

import optuna
from optuna.trial import TrialState

from trialq.driver._storage.store import TrialStore
from trialq.driver.asking.pool import AskPool
from trialq.driver.search_space import DefineSpace, ask_new
from trialq.spec import StudySpec

_log = logging.getLogger("trialq.driver")  # the loop's name: log lines read as before


class NewTrials:
    """The study's next trials, params drawn, for `Sender` to send."""

    def __init__(
        self,
        spec: StudySpec,
        study: optuna.Study,
        store: TrialStore,
        define_space: DefineSpace | None,
    ) -> None:
        self._spec, self._study, self._store = spec, study, store
        self._define_space = define_space
        self.pool: AskPool | None = None
        """Ask processes drawing params beside the driver (`[study] ask_processes`)."""
        self.spares: list[optuna.Trial] = []
        """Trials asked ahead (`[study] ask_ahead`): params drawn, not recorded or sent; the
        next room takes one at once, with no ask in between."""

    def next(self) -> optuna.Trial:
        """The next trial to send: one asked ahead, else a new one."""
        return self.spares.pop(0) if self.spares else self.ask()

    def ask(self) -> optuna.Trial:
        """A new trial of the study, its params drawn from the spec's search space."""
        if self.pool is not None and not self._queued_in_study():
            drawn = self.pool.take(self._study, self._store)
            if drawn is not None:
                return drawn
        return ask_new(self._study, self._spec, self._define_space)

    def ask_ahead(self, ahead: int, left: int) -> None:
        """Ask until `ahead` trials wait for room, within the `left` the run may still ask:
        called once the sends are out, so the ask is on no trial's way to its worker."""
        while len(self.spares) < min(ahead, left):
            self.spares.append(self.ask())

    def give_back_spares(self) -> None:
        """The run ends: trials asked ahead and never sent go back to the study as WAITING,
        params kept (`TrialStore.give_back`): none is lost, none left RUNNING with no
        process. Where the storage refuses, they stay RUNNING with params: the next run
        sends them."""
        try:
            while self.spares:
                self._store.give_back(self.spares[0])
                self.spares.pop(0)
        except Exception as exc:
            _log.warning("trials asked ahead left RUNNING for the next run: %s", exc)

    def start_asking(self, processes: int) -> None:
        """`processes` ask processes, started with the study as it is; where they cannot
        start (no process left to this user), the driver asks every trial."""
        if not processes:
            return
        try:
            self.pool = AskPool(self._spec, self._study, processes)
        except OSError as exc:
            _log.warning("ask processes not started (%s): the driver asks every trial", exc)

    def stop_asking(self) -> None:
        """The ask processes ended; what they drew and the driver did not take is dropped."""
        if self.pool is not None:
            self.pool.close()

    def sync_asking(self, left: int) -> None:
        """The ask processes told what changed, and asked for the draws still wanted (`left`:
        the trials the run may still ask, beyond those asked ahead)."""
        if self.pool is None:
            return
        self.pool.sync(self._study, left - len(self.spares))

    def _queued_in_study(self) -> bool:
        """Whether the study holds WAITING trials (enqueued, or given back): the driver's own
        ask sends those first."""
        storage, study_id = self._study._storage, self._study._study_id
        return bool(storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)))
