"""A call that may hang on a service (a database that does not answer) made on a thread of its
own and waited for a bounded time, so that the run's way out (Ctrl-C, an error) is never held
up by it: what a run that is ending still writes or reads of its study."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def within(seconds: float, work: Callable[[], T], name: str) -> T:
    """`work()`'s value, or its exception; `TimeoutError` where it has not ended within
    `seconds` (it goes on, on a daemon thread, and its outcome is dropped)."""
    outcome: list[tuple[T | None, Exception | None]] = []

    def call() -> None:
        try:
            outcome.append((work(), None))
        except Exception as exc:
            outcome.append((None, exc))

    thread = threading.Thread(target=call, name=name, daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise TimeoutError(f"no answer within {seconds:g} s")
    value, error = outcome[0]
    if error is not None:
        raise error
    return value  # type: ignore[return-value]  # None only where `work` returned None
