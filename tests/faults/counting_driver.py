"""`submit-study`, with every trial told into the file TRIALQ_TEST_TELL_LOG.

The fault suite runs the real driver as a process (it must be killable) and needs to know
whether any trial was told twice. A trial counts as told when its finished state is committed
to the storage (the driver's `MirroredStorage` writes a tell with the step's next
transaction, from its writer thread: a driver killed before that commit never told it, and
the next run tells it). A tell of
a trial the storage already holds as finished is written to the log too, so it shows as a
second tell, although Optuna's own `skip_if_finished` would hide it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import optuna

from trialq.cli import submit_study_main
from trialq.driver._storage.mirror import MirroredStorage
from trialq.driver._storage.sql import Batch

_original_tell = optuna.Study.tell
_original_commit = MirroredStorage._commit


def _log(numbers: list[int]) -> None:
    if numbers:
        with open(os.environ["TRIALQ_TEST_TELL_LOG"], "a") as log:
            log.writelines(f"{number}\n" for number in numbers)


def _counted_tell(self: optuna.Study, trial: Any, *args: Any, **kwargs: Any) -> Any:
    number = trial if isinstance(trial, int) else trial.number
    if self._storage.get_trial(
        self._storage.get_trial_id_from_study_id_trial_number(self._study_id, number)
    ).state.is_finished():
        _log([number])  # told before: a second tell, whatever Optuna makes of it
    return _original_tell(self, trial, *args, **kwargs)


def _counted_commit(self: MirroredStorage, batches: list[Batch]) -> None:
    finishing = [
        self._where[trial_id][1]
        for batch in batches
        for trial_id, writes in batch.writes.items()
        if writes.state is not None and writes.state.is_finished()
    ]
    _original_commit(self, batches)
    _log(finishing)


optuna.Study.tell = _counted_tell  # type: ignore[method-assign]
MirroredStorage._commit = _counted_commit  # type: ignore[method-assign]

if __name__ == "__main__":
    raise SystemExit(submit_study_main(sys.argv[1:]))
