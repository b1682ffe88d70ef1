"""A trial's own process group: every process a trial starts ends with it.

The trial process leads a process group of its own from before the trial's code runs
(`lead_own_group`), so what the trial starts (DataLoader workers, a trainer in a subprocess,
DDP ranks) is in that group, and would otherwise outlive it, re-parented to PID 1, holding
host and GPU memory. When the trial ends in its process (a return, an error, the soft time
limit, a stop or preemption seen), `end_members` ends every other member: SIGTERM, a short
grace, then SIGKILL, bounded. When the trial process itself was killed (the hard time limit,
Celery terminating it), the worker's parent ends the group it led once it sees it exit
(`kill_group_of`): Linux keeps a group's id from being reused while the group has members.

A child made with a bare `os.fork()` is a copy of the trial's stack: whichever way it
leaves the trial's code (it returns, raises, or a SIGTERM's handler raises in it), it exits
there (`forks_exit_here`), and only the process that led the group ends its members, so
such a child never runs the trial's cleanup, never stores a result and never ends the trial
(it SIGTERMed the whole group, the trial told `crashed: signal 15`).

What escapes: a process that leaves the group itself (`setsid`, `setpgid`,
`start_new_session=True`, a daemon's double fork), and the group of a trial whose worker's
parent was killed too (its container's end takes them). A cgroup per trial would hold even
those; this is rq's answer, not systemd's.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import time
from collections.abc import Iterator

TERM_GRACE_S = 2.0
"""How long the other members have to exit after SIGTERM before they are SIGKILLed."""

KILL_ROUNDS = 20
"""SIGKILL rounds at most (a member may fork while the group is killed), `_POLL_S` apart."""

_POLL_S = 0.02


def lead_own_group() -> bool:
    """Make this process the leader of a new process group, before the trial's code runs.

    False where it cannot (a session leader already leads its group and cannot move).
    """
    try:
        os.setpgid(0, 0)
    except PermissionError:
        return False
    return True


@contextlib.contextmanager
def own_group() -> Iterator[None]:
    """This process leads a group for the block; at its end, every other member is ended.
    Its code may start children of its own with `multiprocessing` (a DataLoader's workers,
    DDP ranks): they are in the group, so they end with it."""
    allow_children()
    plain_signals_in_forks()
    led = lead_own_group()
    leader = os.getpid()
    try:
        yield
    finally:
        if led and os.getpid() == leader:  # never in a forked copy of this stack
            end_members()


@contextlib.contextmanager
def forks_exit_here() -> Iterator[None]:
    """Around the trial's own code: a process forked inside it (a bare `os.fork()`) that
    leaves the block, by a return or any exception, exits there with its status, rather
    than run on through the trial's stack: its cleanup, its result, the worker's pool loop.
    """
    trial_pid = os.getpid()
    status = 0
    try:
        yield
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    except BaseException:
        status = 1
        raise
    finally:
        if os.getpid() != trial_pid:
            _exit_now(status)


def _exit_now(status: int) -> None:
    with contextlib.suppress(Exception):  # what it printed, as a normal exit would keep
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(status)


@functools.cache  # once a process: every registration runs at every fork
def plain_signals_in_forks() -> None:
    """A process the trial forks (a `multiprocessing` Pool's or a DataLoader's worker) ends
    on SIGTERM as any process does, as it would outside a worker: it inherited the pool
    process's handler (billiard's `_shutdown_cleanup`, which turns SIGTERM into `SystemExit`
    so the pool process's own cleanup runs), and ran it through the user's code."""
    os.register_at_fork(after_in_child=_default_sigterm)


def _default_sigterm() -> None:
    with contextlib.suppress(ValueError):  # not the main thread: a fork from a thread
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def allow_children() -> None:
    """Let `multiprocessing` start children from this trial process. The worker's pool
    (billiard) marks its processes daemonic, and `multiprocessing` refuses a daemon children
    ("daemonic processes are not allowed to have children": a PyTorch DataLoader with workers
    failed in every trial); its authkey is billiard's type, which the spawn and forkserver
    start methods refuse to pickle. Both are this process's own `_config`."""
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    config.pop("daemon", None)
    if "authkey" in config:
        key = bytes(config["authkey"])
        config["authkey"] = multiprocessing.process.AuthenticationString(key)  # type: ignore[attr-defined]


def end_members(grace_s: float = TERM_GRACE_S) -> int:
    """End every other live process of this process's group: SIGTERM, up to `grace_s` for
    them to exit, then SIGKILL until none is left (`KILL_ROUNDS` at most). How many it found.
    """
    group = os.getpgrp()
    found = members(group)
    _signal_all(found, group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = found
    while left and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        left = members(group)
    for _ in range(KILL_ROUNDS):
        if not left:
            break
        _signal_all(left, group, signal.SIGKILL)
        time.sleep(_POLL_S)
        left = members(group)
    return len(found)


def kill_own_group() -> None:
    """SIGKILL this process and, where it leads a group of its own, every member of that
    group: the driver gave up on the attempt (its kill mark, read by the trial's beacon), and
    nothing of it may run on. A process that leads no group of its own kills only itself
    (its group is its worker's)."""
    me = os.getpid()
    if os.getpgrp() == me:
        os.killpg(me, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


def kill_group_of(leader_pid: int) -> None:
    """SIGKILL what is left of the group a trial process led, once that process has exited
    (the worker's parent calls it for every trial process it sees end). Nothing, where no
    such group is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader_pid, signal.SIGKILL)


def members(group: int) -> list[int]:
    """The live processes of process group `group` other than this one (zombies hold
    nothing and are left out)."""
    me = os.getpid()
    return [pid for pid in _pids() if pid != me and _group_if_alive(pid) == group]


def _pids() -> list[int]:
    with os.scandir("/proc") as entries:
        return [int(entry.name) for entry in entries if entry.name.isdigit()]


def _group_if_alive(pid: int) -> int | None:
    """The process group of `pid` from /proc/<pid>/stat; None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    state, _ppid, group = fields[0], fields[1], fields[2]
    return None if state in (b"Z", b"X") else int(group)


def _signal_all(pids: list[int], group: int, sig: signal.Signals) -> None:
    """Signal each process through a pidfd, checked to be still in `group` once the fd is
    open: a pid that was reused meanwhile is never signalled."""
    for pid in pids:
        with contextlib.suppress(OSError):
            fd = os.pidfd_open(pid)
            try:
                if _group_if_alive(pid) == group:
                    signal.pidfd_send_signal(fd, sig)
            finally:
                os.close(fd)
