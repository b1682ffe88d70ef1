"""Structured, levelled logs: every line names the study, the trial and the attempt.

A trial process runs one attempt, so it sets the context once (`trial_context`) and every
line logged inside it, by trialq, Celery or the trial's own code, carries the three fields.
The driver juggles many trials in one thread, so it passes them per call instead:
`log.info("sent", extra=fields(request))`. Lines outside any trial show `-`.

Nothing is configured on import: the worker gives Celery's handlers the fields and format
(`adopt_handlers`), and `submit-study -v` adds one stderr handler (`to_stderr`); without
either, trialq's INFO lines go nowhere and the command's output stays clean.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from types import MappingProxyType
from typing import Protocol, TextIO

FIELDS = ("study", "trial", "attempt")
FORMAT = (
    "%(asctime)s %(levelname)s %(name)s pid=%(process)d "
    "study=%(study)s trial=%(trial)s attempt=%(attempt)s | %(message)s"
)
"""logfmt-like: `key=value` pairs a log shipper can split, then the message."""

_NO_TRIAL: Mapping[str, str] = MappingProxyType({})
_context: ContextVar[Mapping[str, str]] = ContextVar("trialq_log_context", default=_NO_TRIAL)


class TrialLike(Protocol):
    """Anything that names one attempt of one trial (a request, a result, an address)."""

    @property
    def study(self) -> str: ...
    @property
    def number(self) -> int: ...
    @property
    def attempt(self) -> int: ...


def fields(trial: TrialLike) -> dict[str, str]:
    """The three fields of a trial, for `extra=` or for the context."""
    return {"study": trial.study, "trial": str(trial.number), "attempt": str(trial.attempt)}


@contextmanager
def trial_context(trial: TrialLike) -> Iterator[None]:
    """Every line logged inside the block names this trial (one trial per process)."""
    token = enter_trial(trial)
    try:
        yield
    finally:
        leave_trial(token)


def enter_trial(trial: TrialLike) -> Token[Mapping[str, str]]:
    """From now on, lines name this trial; for hooks that cannot wrap a block (signals)."""
    return _context.set(fields(trial))


def leave_trial(token: Token[Mapping[str, str]]) -> None:
    """Back to whatever the lines named before `enter_trial`."""
    _context.reset(token)


class ContextFilter(logging.Filter):
    """Puts the fields on every record: from `extra=`, else the context, else `-`."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Never drops a record; only adds what the format needs."""
        current = _context.get()
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, current.get(name, "-"))
        return True


def adopt_handlers(logger: logging.Logger) -> None:
    """Give a logger's existing handlers (Celery's, in the worker) the fields and format."""
    for handler in logger.handlers:
        handler.addFilter(ContextFilter())
        handler.setFormatter(logging.Formatter(FORMAT))


class _CurrentStderrHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever `sys.stderr` is when a line is logged, not when it was made.

    rich's live progress bar swaps `sys.stderr` for a proxy that prints above the bar; a
    handler holding the original stream would scribble over the bar instead.
    """

    def emit(self, record: logging.LogRecord) -> None:
        """Follow the current `sys.stderr`, then write as usual."""
        self.stream = sys.stderr
        super().emit(record)


def to_stderr(level: str | int) -> None:
    """Show trialq's own lines at `level` and above on stderr (once, however often called)."""
    logger = logging.getLogger("trialq")
    for old in [h for h in logger.handlers if isinstance(h, _CurrentStderrHandler)]:
        logger.removeHandler(old)
    handler = _CurrentStderrHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
