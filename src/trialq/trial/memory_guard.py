"""The host-memory cap of a trial process (`memory_limit_mb`).

A thread samples the process's resident memory; past the cap it leaves word for the driver
and kills its own process at once. A soft signal would wait for the interpreter, and a long
native allocation (TensorFlow's) would go on growing meanwhile; a kill cannot be ignored.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

import psutil

SAMPLE_INTERVAL_S = 0.05


class MemoryGuard:
    """Watches this process's RSS and calls `on_exceeded(rss)` then SIGKILLs past the cap."""

    def __init__(self, limit_bytes: int, on_exceeded: Callable[[int], None]) -> None:
        self._limit_bytes = limit_bytes
        self._on_exceeded = on_exceeded
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trialq-memory", daemon=True)
        self._process = psutil.Process()

    def __enter__(self) -> MemoryGuard:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=1)

    def _watch(self) -> None:
        while not self._stopped.wait(SAMPLE_INTERVAL_S):
            rss = int(self._process.memory_info().rss)
            if rss > self._limit_bytes:
                try:
                    self._on_exceeded(rss)
                finally:
                    os.kill(os.getpid(), signal.SIGKILL)
