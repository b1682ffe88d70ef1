"""A Ctrl-C or SIGTERM that is never lost.

Python's own SIGINT handler raises `KeyboardInterrupt` wherever the main thread happens to
be. Where that is a finalizer (a `__del__`, a weakref callback: SQLAlchemy's class registry
runs them during garbage collection), Python prints "Exception ignored" and the interrupt is
gone: a Ctrl-C'd study ran on to its end and exited 0. `interrupt` raises *and* remembers,
and the driver's loop calls `raise_if_came()` each pass, so a swallowed one still ends it.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_came: list[int] = []
"""The signals that came, in this process (signals are the process's, not an object's)."""


def interrupt(signum: int, frame: FrameType | None) -> None:
    """The CLI's handler for SIGINT and SIGTERM."""
    _came.append(signum)
    raise KeyboardInterrupt


def install() -> None:
    """SIGINT and SIGTERM handled by `interrupt` (only the main thread may set handlers);
    a SIGINT ignored by whoever started the process (`nohup`, `cmd &`) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, interrupt)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, interrupt)


def raise_if_came() -> None:
    """Raise the interrupt again where one came and was swallowed on its way."""
    if _came:
        raise KeyboardInterrupt
