"""An ask process: `python -m trialq.driver.asking.asker FD`, started by the driver's
`pool.AskPool` with its end of a socket pair as FD.

It reads the driver's messages (`protocol`) and draws params while asks are wanted, taking in
every change already sent before each draw, so each ask sees the study as recent as the
driver has told it. It ends when told to (`None`) or when the driver is gone (the socket
closes): it holds nothing the study needs. Ctrl-C is the driver's to act on, not its own.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import warnings
from multiprocessing.connection import Connection

import optuna

from trialq.driver.asking.protocol import AskFor, Changes, Failed, Start
from trialq.driver.asking.replica import Replica


def serve(conn: Connection) -> None:
    """Answer the driver until it says stop."""
    start = conn.recv()
    assert isinstance(start, Start), "the driver speaks first"
    replica = Replica(start.spec, start.seed, start.trials)
    wanted = 0
    while True:
        if wanted == 0 or conn.poll(0):  # idle: wait for news; else take what is there
            message = conn.recv()
            if message is None:
                return
            if isinstance(message, Changes):
                replica.apply(message.trials, message.settled)
            elif isinstance(message, AskFor):
                wanted += message.count
            continue
        conn.send(replica.ask())
        wanted -= 1


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    conn = Connection(socket.socket(fileno=int(argv[0])).detach())
    try:
        serve(conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return 0  # the driver is gone: nothing here to keep
    except Exception as exc:  # the driver says it, once, and asks in its place
        reason = (str(exc).strip().splitlines() or [""])[0]
        with contextlib.suppress(OSError):
            conn.send(Failed(f"{type(exc).__name__}: {reason}"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
