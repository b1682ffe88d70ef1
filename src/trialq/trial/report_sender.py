"""`ReportSender`: a trial's reports sent by a thread of its own, so training never waits
on Redis.

`trial.report()` puts the value on a bounded queue in the trial's process and returns at
once. One background thread sends what is queued, a batch a round trip, over a client whose
connects and replies are awaited `SOCKET_TIMEOUT_S` at most; a batch Redis did not take is
sent again (backing off up to `RETRY_MAX_S`) until it is taken, and numbered, so that a
batch whose reply was lost is not stored twice. `should_prune()` and `should_stop()` read
flags the same thread refreshes: while Redis answers, a call waits up to `FLAG_WAIT_S` for an
answer asked after it (so a flag is seen as promptly as before); while Redis does not, the
last answer is returned at once. Before the trial's result is returned, `close()` waits up to
`FLUSH_LIMIT_S` for the queue to empty: the driver reads every report before the result.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import redis

from trialq.wire.channel import (
    MAX_REPORTS_KEPT,
    Flags,
    NumberedReport,
    ReportChannel,
    TrialAddress,
)

SOCKET_TIMEOUT_S = 2.0
"""The longest the sending thread waits on one connect or reply before it tries again."""

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0
"""Waits between tries while Redis does not take a batch: doubling from the first to this."""

FLAG_WAIT_S = 0.5
"""The longest `should_prune()`/`should_stop()` wait for a fresh flag (while Redis answers).
A round trip takes a millisecond; the bound is for a loaded host, where the sending thread
may not be scheduled for tens of ms (50 ms was missed under CI's load, and the yes to a stop
just asked for came one call late). Redis hung costs it once, then the last answer is used."""

FLUSH_LIMIT_S = 120.0
"""How long the reports still queued when the trial returns are waited for: as long as the
worker retries storing the trial's result, which cannot reach the driver sooner anyway."""

MAX_REPORTS_PER_ATTEMPT = MAX_REPORTS_KEPT
"""Reports one attempt sends at most; later ones are dropped and counted (the trial's log
and its `reports_dropped` attr say how many). A pruner and a plot need no more, and the
driver records each one in the study's storage."""

MAX_QUEUED = MAX_REPORTS_KEPT
"""Reports waiting for Redis at most; past it the oldest go (the stream keeps no more)."""

BATCH = 500
"""Reports sent in one round trip at most."""

_log = logging.getLogger("trialq.reports")

Queued = tuple[TrialAddress, NumberedReport]


class ReportSender:
    """The trial-facing calls of a `ReportChannel` (`report`, `prune_requested`,
    `stop_requested`), none of which waits on Redis; `close()` at the trial's end."""

    def __init__(self, channel: ReportChannel) -> None:
        self._channel = channel.with_timeout(SOCKET_TIMEOUT_S)
        self._cond = threading.Condition()
        self._queue: deque[Queued] = deque()
        self._in_flight: list[Queued] = []
        self._seq = self._dropped = self._over = self._unsent = 0
        self._flags: dict[TrialAddress, Flags] = {}
        self._asks = self._answered = 0
        self._healthy = True
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="trialq-reports", daemon=True)
        self._thread.start()

    def report(self, address: TrialAddress, step: int, value: float) -> None:
        """Queue one intermediate value for the driver; never waits."""
        with self._cond:
            if self._seq >= MAX_REPORTS_PER_ATTEMPT:
                self._over += 1
                return
            if len(self._queue) >= MAX_QUEUED:
                self._queue.popleft()
                self._dropped += 1
            self._seq += 1
            self._queue.append((address, NumberedReport(self._seq, step, value)))
            self._cond.notify_all()

    def prune_requested(self, address: TrialAddress) -> bool:
        """Whether the driver asked this attempt to stop, as fresh as `FLAG_WAIT_S` allows."""
        return self._fresh_flags(address).prune

    def stop_requested(self, address: TrialAddress) -> bool:
        """Whether this attempt was told to stop, as fresh as `FLAG_WAIT_S` allows."""
        return self._fresh_flags(address).stop

    def close(self, limit_s: float = FLUSH_LIMIT_S) -> int:
        """Wait up to `limit_s` for every queued report to be sent, then stop sending; the
        number of reports that were not (logged, with those dropped for the bound)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(limit_s)
        with self._cond:
            unsent = len(self._queue) + len(self._in_flight)
            self._queue.clear()
            self._in_flight = []
        self._unsent = unsent
        _log_losses(unsent, self._dropped, limit_s, self._over)
        return unsent

    @property
    def dropped(self) -> int:
        """Reports of this attempt the driver will never see: past the bound, pushed out
        while Redis was away, or not sent by the trial's end."""
        return self._over + self._dropped + self._unsent

    def _fresh_flags(self, address: TrialAddress) -> Flags:
        with self._cond:
            self._flags.setdefault(address, Flags())
            self._asks += 1
            asked = self._asks
            self._cond.notify_all()
            answered = lambda: self._answered >= asked or not self._healthy  # noqa: E731
            if self._healthy and not self._cond.wait_for(answered, FLAG_WAIT_S):
                self._healthy = False  # no answer in time: the next calls take the last one
            return self._flags[address]

    # The sending thread.

    def _run(self) -> None:
        delay = RETRY_FIRST_S
        while (work := self._next()) is not None:
            batch, asks = work
            try:
                self._send(batch)
                self._refresh_flags(asks)
            except redis.RedisError:
                self._set_healthy(False)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_FIRST_S

    def _next(self) -> tuple[list[Queued], int] | None:
        """Wait for something to do: the batch to send (the one Redis did not take first),
        and the flag asks to answer. None once closing with nothing left to send."""
        with self._cond:
            while not (self._in_flight or self._queue or self._asks > self._answered):
                if self._closing:
                    return None
                self._cond.wait()
            if self._closing and not (self._in_flight or self._queue):
                return None
            if not self._in_flight:
                count = min(BATCH, len(self._queue))
                self._in_flight = [self._queue.popleft() for _ in range(count)]
            return list(self._in_flight), self._asks

    def _send(self, batch: list[Queued]) -> None:
        for address in dict.fromkeys(address for address, _ in batch):
            reports = [report for to, report in batch if to == address]
            self._channel.send_reports(address, reports)
        with self._cond:
            self._in_flight = []

    def _refresh_flags(self, asks: int) -> None:
        if asks <= self._answered:
            self._set_healthy(True)
            return
        with self._cond:
            addresses = list(self._flags)
        fresh = {address: self._channel.flags(address) for address in addresses}
        with self._cond:
            self._flags.update(fresh)
            self._answered = asks
            self._healthy = True
            self._cond.notify_all()

    def _set_healthy(self, healthy: bool) -> None:
        with self._cond:
            self._healthy = healthy
            self._cond.notify_all()


def _log_losses(unsent: int, dropped: int, limit_s: float, over: int) -> None:
    if over:
        _log.warning(
            "%d report(s) dropped: past the first %d of this attempt (the bound on reports)",
            over, MAX_REPORTS_PER_ATTEMPT,
        )  # fmt: skip
    if unsent:
        _log.warning(
            "%d report(s) not sent: Redis did not take them within %g s of the trial's end",
            unsent, limit_s,
        )  # fmt: skip
    if dropped:
        _log.warning(
            "%d report(s) dropped: more than %d waited for Redis at once", dropped, MAX_QUEUED
        )
