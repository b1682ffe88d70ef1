"""A trial's soft time limit, counted from when its code starts.

Celery's soft limit counts from when the pool took the task: time its process spent waiting
for Redis before the trial began (a frozen broker, a STARTED that could not be stored) was
counted against the trial, and the limit could land in trialq's own steps around it, where
it failed an attempt that never ran. The trial process arms this one as
the trial's code starts and disarms it as that returns; the hard limit (Celery's) still
bounds the whole process.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class SoftLimitPassed(Exception):
    """Raised in the trial's code when its `timeout_s` has passed: it ends as `timeout`, or,
    caught, runs on until its hard limit kills it."""


@contextmanager
def soft_limit(seconds: float | None) -> Iterator[None]:
    """Raise `SoftLimitPassed` in this (main) thread once `seconds` pass within the block;
    nothing without seconds, or off the main thread (where no signal is delivered)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, _passed)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _passed(signum: int, frame: FrameType | None) -> None:
    raise SoftLimitPassed()
