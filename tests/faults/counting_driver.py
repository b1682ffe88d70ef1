"""`submit-study`, with every `Study.tell` counted into the file TRIALQ_TEST_TELL_LOG.

The fault suite runs the real driver as a process (it must be killable) and needs to know
whether any trial was told twice; Optuna's own `skip_if_finished` would hide it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import optuna

from trialq.cli import submit_study_main

_original_tell = optuna.Study.tell


def _counted_tell(self: optuna.Study, trial: Any, *args: Any, **kwargs: Any) -> Any:
    number = trial if isinstance(trial, int) else trial.number
    with open(os.environ["TRIALQ_TEST_TELL_LOG"], "a") as log:
        log.write(f"{number}\n")
    return _original_tell(self, trial, *args, **kwargs)


optuna.Study.tell = _counted_tell  # type: ignore[method-assign]

if __name__ == "__main__":
    raise SystemExit(submit_study_main(sys.argv[1:]))
