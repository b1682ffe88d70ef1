"""When failing trials should stop the run: the same failure, trial after trial.

A worker that refuses every entrypoint, or a trial that fails the same way whatever its
params (a bug, a missing dependency), would burn the study's whole budget in seconds and
leave it "finished". `FailureStreak` watches what the loop tells and what workers refuse,
and names the cause once `[study] max_failures_in_a_row` of them in a row were the same
failure with no success between. Pure: the loop feeds it and raises `FailingTrials`.

Only failures that say nothing of the params count: `error`, `crashed`, `worker_lost`, a
worker's refusal, and a GPU memory guard's kill (a library beside the framework, or an
allowance too small for it: the same whatever the params). `oom`, `timeout`, `not_finite`
and `pruned` are what a search learns from (`Outcome.meaning` says which count).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trialq.wire.failures import headline
from trialq.wire.messages import Outcome


@dataclass
class FailureStreak:
    """Failures in a row with one signature; `limit` 0 never stops."""

    limit: int
    signature: str | None = None
    count: int = 0
    last_error: str = ""

    def saw(self, outcome: Outcome, error: str | None) -> str | None:
        """Record one trial's end (or refusal); the reason to stop the run, once reached."""
        if not outcome.in_failure_streak:
            self.signature, self.count = None, 0
            return None
        signature = _signature(outcome, error)
        self.count = self.count + 1 if signature == self.signature else 1
        self.signature, self.last_error = signature, headline(error) or "no error text"
        return self._reason(outcome) if self.limit and self.count >= self.limit else None

    def _reason(self, outcome: Outcome) -> str:
        what = _SAID.get(outcome, f"{outcome}")
        return (
            f"stopped: {self.count} trials in a row {what} the same way ({self.last_error}); "
            f"the rest of the budget is kept (max_failures_in_a_row = {self.limit})"
        )


_SAID = {
    Outcome.REFUSED: "refused by their workers",
    Outcome.GPU_GUARD: "killed by the GPU memory guard",
}


def _signature(outcome: Outcome, error: str | None) -> str:
    """The outcome and the error's first line, numbers blanked (pids, sizes, trial numbers)."""
    return f"{outcome}: {re.sub(r'[0-9]+', '#', headline(error) or '')}"
