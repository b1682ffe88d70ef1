"""A process that dies with its parent: the kernel signals it when the parent is gone.

Nothing trialq starts may outlive what started it, however that ends (a SIGKILL runs no
cleanup): `--local`'s Redis and workers die with the driver, and a trial process with its
worker, so no orphan keeps a GPU or a port. Linux only (`PR_SET_PDEATHSIG`); elsewhere a
no-op. The signal fires when the thread that forked the child ends: trialq forks from
main threads only (Celery's prefork pool forks from the worker's event loop).
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
