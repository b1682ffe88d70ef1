"""Turning what went wrong in a trial into an `Outcome` and a short error text.

Classification happens in the trial's process: exception classes do not cross JSON as
themselves, so the driver would see Celery's rebuilt class, not TensorFlow's.
"""

from __future__ import annotations

import traceback

from trialq.wire.messages import Outcome

_OOM_TYPE_NAMES = frozenset({"ResourceExhaustedError", "OutOfMemoryError"})
_OOM_MESSAGES = (
    "oom when allocating",
    "out of memory",
    "cuda_error_out_of_memory",
    "cudnn_status_alloc_failed",
    "cublas_status_alloc_failed",
    "resource exhausted",
)
TRACEBACK_TAIL_LINES = 12


def classify(exc: BaseException) -> Outcome:
    """`oom` for any way a device or host runs out of memory, else `error`."""
    if isinstance(exc, MemoryError) or type(exc).__name__ in _OOM_TYPE_NAMES:
        return Outcome.OOM
    message = str(exc).lower()
    if any(sign in message for sign in _OOM_MESSAGES):
        return Outcome.OOM
    return Outcome.ERROR


def headline(error: str | None) -> str | None:
    """The first line of an error text `describe` wrote (`Type: message`)."""
    return error.split("\n", 1)[0] if error else None


def describe(exc: BaseException) -> str:
    """`Type: message`, then the last lines of the traceback."""
    lines = traceback.format_exception(exc)
    tail = "".join(lines).splitlines()[-TRACEBACK_TAIL_LINES:]
    headline = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    return headline + "\n" + "\n".join(tail)


def failure_line(number: int, outcome: str | None, error: str | None) -> str:
    """`#3 error: ZeroDivisionError: float division by zero`: why a trial failed, in a line."""
    return f"#{number} {outcome}: {headline(error) or 'no error text'}"
