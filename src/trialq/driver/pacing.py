"""How often the loop's periodic checks run: every so often, and never most of the time.

The lost check (is each waiting trial still queued?) and the outside check (does this
driver still hold its study; did someone finish a trial in flight?) each cost round trips.
Next to its services that is a millisecond; 400 ms away, with packets lost, the outside
check alone took a third of a driver's time at a 2 s interval (issue 26, tests/hosts). So a
check is spaced by its interval or by ten times what it last took, whichever is longer.

The loop's own pause between passes follows the same rule (`PassPacing`): a pass reads every
trial in flight, which at a thousand GPUs costs tens of milliseconds, and twenty such passes a
second would take the driver's whole core while the trials run for minutes. A trial's result
still ends the pause at once (the results channel); what only a pass sees (a start, a crash
the pool reported, a lost worker) is seen within the pause.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
"""The longest pause the reads' cost stretches the loop's to: a crash or a start is seen
within a second, however many trials are in flight."""


@dataclass
class PassPacing:
    """The pause after a pass: the loop's poll interval, or ten times what the pass's reads of
    the trials in flight took (at most `MOST_PAUSE_S`), whichever is longer."""

    _reads_s: float = 0.0

    def reading(self, started: float, ended: float) -> None:
        """One of this pass's reads of the trials in flight ran from `started` to `ended`."""
        self._reads_s += max(0.0, ended - started)

    def pause_s(self, poll_interval_s: float) -> float:
        """The pause after this pass (its reads' cost then starts again at zero)."""
        stretched = min(MOST_PAUSE_S, self._reads_s / MOST_OF_THE_TIME)
        self._reads_s = 0.0
        return max(poll_interval_s, stretched)
