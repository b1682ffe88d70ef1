"""How often the loop's periodic checks run: every so often, and never most of the time.

The lost check (is each waiting trial still queued?) and the outside check (does this
driver still hold its study; did someone finish a trial in flight?) each cost round trips.
Next to its services that is a millisecond; 400 ms away, with packets lost, the outside
check alone took a third of a driver's time at a 2 s interval (tests/hosts). So a
check is spaced by its interval or by ten times what it last took, whichever is longer.

The loop's full passes follow the same rule (`PassPacing`): a full pass reads every trial in
flight, which at a thousand GPUs costs tens of milliseconds, and twenty such passes a second
would take the driver's whole core while the trials run for minutes. A trial's result still
ends the pause at once (the results channel), and the pass it brings reads only the trials
announced; what only a full pass sees (a start, a crash the pool reported, a lost worker,
intermediate values) is seen within the pause.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

MOST_OF_THE_TIME = 0.1
"""The share of the driver's time a periodic check may take."""


@dataclass
class Periodic:
    """A check due every `interval_s`, or less often where it takes long."""

    interval_s: float
    _next: float = -math.inf

    def due(self, now: float) -> bool:
        """Whether the check is due at `now`; if so it counts as made then."""
        if now < self._next:
            return False
        self._next = now + self.interval_s
        return True

    def took(self, started: float, ended: float) -> None:
        """The check made at `started` ended at `ended`: space the next one by its cost."""
        self._next = max(self._next, started + (ended - started) / MOST_OF_THE_TIME)


MOST_PAUSE_S = 1.0
"""The longest the reads' cost stretches the time between full passes to: a crash or a start
is seen within a second, however many trials are in flight."""

HEARD_SHARE = 0.01
"""The share of the driver's time a full pass's reads may take while results are announced
and heard: then each result brings a pass of its own, and a full pass is only the net for
what is not announced (a start, a crash the pool reported, a lost worker, intermediate
values), so it may take a hundredth of the time, not a tenth. With workers beside the driver
a tenth was a full read of 128 trials in flight for about every result."""


@dataclass
class PassPacing:
    """Which trials a pass reads, and the pause after it.

    A full pass reads every trial in flight; the next is due the loop's poll interval after
    it ends, or ten times what its reads took (a hundred times while announcements are heard:
    `HEARD_SHARE`; at most `MOST_PAUSE_S`), whichever is longer.
    In between, a pass follows each announced result and reads only the trials announced
    (owed until a pass reads them): a result costs a read of its own trial, not of the
    thousand beside it. Where the announcements cannot be trusted (None: some
    may have gone unheard), the pass is a full one.
    """

    full: bool = True
    """Whether this pass reads every trial in flight."""
    _heard: bool = False
    """Whether this pass's announcements could be trusted (the subscription held)."""
    _reads_s: float = 0.0
    _next_full_s: float = -math.inf
    _owed: set[str] = field(default_factory=set)
    _reading: list[str] = field(default_factory=list)

    def to_read(
        self, now: float, announced: set[str] | None, in_flight: Collection[str]
    ) -> list[str]:
        """The trials the pass starting `now` reads: every one in flight on a full pass, else
        those announced that are still in flight and owed a read."""
        self._heard = announced is not None
        if announced is not None:
            self._owed |= announced
        self.full = announced is None or now >= self._next_full_s
        owed = (task_id for task_id in self._owed if task_id in in_flight)
        self._reading = list(in_flight) if self.full else list(owed)
        return self._reading

    def reading(self, started: float, ended: float) -> None:
        """One of this pass's reads of the trials in flight ran from `started` to `ended`."""
        self._reads_s += max(0.0, ended - started)

    def read(self, ended: float, poll_interval_s: float) -> None:
        """The pass ended at `ended`, its reads done: what it read is no longer owed, and a
        full pass sets when the next is due, `poll_interval_s` on at the least (its reads'
        cost then starts again at zero)."""
        if self.full:
            self._owed.clear()
            share = HEARD_SHARE if self._heard else MOST_OF_THE_TIME
            stretched = min(MOST_PAUSE_S, self._reads_s / share)
            self._next_full_s = ended + max(poll_interval_s, stretched)
        else:
            self._owed.difference_update(self._reading)
        self._reads_s = 0.0

    def pause_s(self, now: float) -> float:
        """The pause after this pass: until the next full one is due (a result ends it)."""
        return max(0.0, self._next_full_s - now)
