"""Which trials of a study changed since the last look: the new ones, and those seen
unfinished whose state or params moved since. O(trials in flight) a look, as
`trialq.driver.sampling.history.TrialIndex` is: a trial's number is its place in the
storage's list."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from trialq.driver.asking.protocol import slim


class ChangeFeed:
    """The changes of one study, each handed out once, slimmed (`protocol.slim`)."""

    def __init__(self) -> None:
        self._looked_at = 0
        self._unfinished: dict[int, tuple[object, int]] = {}  # number -> (state, params)

    def changes(self, study: optuna.Study) -> list[FrozenTrial]:
        trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        changed = [
            trials[number]
            for number, seen in list(self._unfinished.items())
            if (trials[number].state, len(trials[number].params)) != seen
        ]
        changed += trials[self._looked_at :]
        self._looked_at = len(trials)
        for trial in changed:
            if trial.state.is_finished():
                self._unfinished.pop(trial.number, None)
            else:
                self._unfinished[trial.number] = (trial.state, len(trial.params))
        return [slim(trial) for trial in changed]
