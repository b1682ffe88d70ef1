"""A log file per trial attempt: what the trial printed and trialq's lines about it.

A worker's own log mixes every trial it ran; one attempt's output is easier to read apart.
In the trial's process, while it runs, a handler on the root logger writes every line
logged there (the trial's prints, which Celery turns into log lines, its stderr, trialq's
lines naming the trial) into `<folder>/<study>/trial-<number>-attempt-<attempt>.log`. What
a C library or a child writes to the file descriptors directly is not in it (it is in the
worker's log, as before). Its path goes on the trial's result and so on its record
(`log_file`), and `trialq status` shows it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from trialq import logs
from trialq.logs import TrialLike


def attempt_log_path(folder: Path, trial: TrialLike) -> Path:
    """Where one attempt's log goes, named by its study, trial and attempt."""
    return folder / trial.study / f"trial-{trial.number}-attempt-{trial.attempt}.log"


class AttemptLog:
    """The file handler of one attempt, from `open` to `close`."""

    def __init__(self, folder: Path, trial: TrialLike) -> None:
        self.path = attempt_log_path(folder, trial)
        self._handler: logging.Handler | None = None

    def open(self) -> AttemptLog:
        """Start writing every line logged in this process to the attempt's file; a folder
        that cannot be written is one warning, and the trial runs without it."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(self.path, encoding="utf-8")
        except OSError as exc:
            logging.getLogger("trialq.worker").warning("no log file for this attempt: %s", exc)
            return self
        handler.addFilter(logs.ContextFilter())
        handler.setFormatter(logging.Formatter(logs.FORMAT))
        logging.getLogger().addHandler(handler)
        self._handler = handler
        return self

    @property
    def written(self) -> bool:
        """Whether the file is being written."""
        return self._handler is not None

    def close(self) -> None:
        """Stop writing to the file, and close it."""
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None
