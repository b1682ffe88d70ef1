"""How often the loop's periodic checks run: every so often, and never most of the time.

The lost check (is each waiting trial still queued?) and the outside check (does this
driver still hold its study; did someone finish a trial in flight?) each cost round trips.
Next to its services that is a millisecond; 400 ms away, with packets lost, the outside
check alone took a third of a driver's time at a 2 s interval (issue 26, tests/hosts). So a
check is spaced by its interval or by ten times what it last took, whichever is longer.
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
