"""The trial's own soft time limit (`trialq.trial.soft_limit`): it counts from the trial's
code, not from when the worker took the task (issue 38, row 4)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from trialq.trial.soft_limit import SoftLimitPassed, soft_limit


def test_the_limit_ends_the_code_in_the_block() -> None:
    started = time.monotonic()
    with pytest.raises(SoftLimitPassed), soft_limit(0.2):
        time.sleep(30)
    assert time.monotonic() - started < 10


def test_a_block_that_returns_in_time_disarms_it_and_leaves_sigalrm_as_it_was() -> None:
    before = signal.getsignal(signal.SIGALRM)
    with soft_limit(0.3):
        pass
    time.sleep(0.5)  # would raise here were it still armed
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_no_limit_off_the_main_thread_or_without_seconds() -> None:
    ran: list[bool] = []

    def block() -> None:
        with soft_limit(0.01):
            time.sleep(0.1)
        ran.append(True)

    thread = threading.Thread(target=block)
    thread.start()
    thread.join()
    with soft_limit(None):
        time.sleep(0.05)
    assert ran == [True]
