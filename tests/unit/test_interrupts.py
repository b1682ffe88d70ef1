"""A Ctrl-C that lands in a finalizer: Python's own handler loses it, the driver's does not
(`trialq.driver.interrupts`). Each case runs in a process of its own, SIGINT reset there
(a script's background process starts with it ignored)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

LANDS_IN_A_FINALIZER = """
import os, signal, sys
from trialq.driver import interrupts
if sys.argv[1] == "trialq":
    interrupts.install()

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):  # the handler runs here, inside the finalizer
            pass

Finalized()
try:
    interrupts.raise_if_came()
except KeyboardInterrupt:
    print("stopped")
else:
    print("went on")
"""


def _run(handler: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LANDS_IN_A_FINALIZER, handler],
        capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def test_pythons_own_handler_loses_an_interrupt_in_a_finalizer() -> None:
    done = _run("python")
    assert done.stdout.strip() == "went on", done
    assert "KeyboardInterrupt" in done.stderr  # printed as "Exception ignored", then gone


def test_the_drivers_handler_keeps_it_for_the_loop() -> None:
    done = _run("trialq")
    assert done.stdout.strip() == "stopped", done


@pytest.mark.parametrize("ignored", [True, False])
def test_a_sigint_ignored_by_the_starter_stays_ignored(ignored: bool) -> None:
    code = (
        "import signal; from trialq.driver import interrupts; interrupts.install(); "
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    )
    wanted = signal.SIG_IGN if ignored else signal.SIG_DFL
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, wanted),
    )  # fmt: skip
    assert done.stdout.strip() == str(ignored), done
