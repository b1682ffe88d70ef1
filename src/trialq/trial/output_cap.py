"""How much a trial may print into its worker's log: the first `limit` bytes of its
stdout and stderr together, then one line saying the rest was dropped.

A worker's log is shared by every trial it runs (Celery turns a trial's prints into log
lines); a trial printing 100 MB put all of it there, filling the disk
and burying every other trial's lines. Output written to the file descriptors directly (a
C library, a child process) is not counted: only what passes through `sys.stdout` and
`sys.stderr`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TextIO


class _Budget:
    """The bytes left to the trial's output, shared by its stdout and stderr."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit
        self.dropped = 0


class CappedStream:
    """A text stream that passes writes on until its budget is spent, then drops them and
    says so once, on the stream it wraps."""

    def __init__(self, stream: TextIO, budget: _Budget) -> None:
        self._stream = stream
        self._budget = budget

    def write(self, text: str) -> int:
        budget = self._budget
        size = len(text.encode("utf-8", "replace"))
        if size <= budget.left:
            budget.left -= size
            return self._stream.write(text)
        kept = text[: budget.left] if budget.left > 0 else ""  # characters: about the bytes
        if kept:
            self._stream.write(kept)
        if budget.dropped == 0:
            self._stream.write(
                f"\n[trialq] trial output capped at {budget.limit} bytes "
                "(TRIALQ_TRIAL_OUTPUT_MAX_BYTES): the rest is dropped\n"
            )
        budget.left = 0
        budget.dropped += size - len(kept)
        return len(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)  # flush, isatty, fileno, encoding...


@contextlib.contextmanager
def capped_output(limit: int) -> Iterator[_Budget | None]:
    """Cap `sys.stdout` and `sys.stderr` to `limit` bytes together for the block (0: no
    cap); what was there before is put back after it."""
    if limit <= 0:
        yield None
        return
    budget = _Budget(limit)
    before = sys.stdout, sys.stderr
    sys.stdout = CappedStream(before[0], budget)
    sys.stderr = CappedStream(before[1], budget)
    try:
        yield budget
    finally:
        sys.stdout, sys.stderr = before
