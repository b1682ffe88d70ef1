"""A process a trial forks ends on SIGTERM as any process does (`process_group`): it does not
keep the handler of the pool process it was forked from, which turned SIGTERM into a
`SystemExit` run through the child's code. Each case in a fresh interpreter of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

FORKS_A_POOL = """
import multiprocessing, signal, sys
from trialq.trial import process_group

def raise_exit(signum, frame):  # as billiard's _shutdown_cleanup in a pool process
    sys.exit(1)

def disposition(_):
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

signal.signal(signal.SIGTERM, raise_exit)
if sys.argv[1] == "trialq":
    process_group.plain_signals_in_forks()
    process_group.plain_signals_in_forks()  # once is enough, twice the same
with multiprocessing.get_context("fork").Pool(1) as pool:
    child_default = pool.map(disposition, [0])[0]
print(child_default, signal.getsignal(signal.SIGTERM) is raise_exit)
"""


@pytest.mark.parametrize(("mode", "child_default"), [("plain", False), ("trialq", True)])
def test_a_forked_child_gets_the_default_sigterm(mode: str, child_default: bool) -> None:
    done = subprocess.run([sys.executable, "-c", FORKS_A_POOL, mode], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(child_default), "True"], "the trial process keeps its own"
