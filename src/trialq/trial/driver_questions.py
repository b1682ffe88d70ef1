"""`DriverQuestions`: what a trial asks its driver while it runs (`trialq.wire.suggest`):
the value of a param its task did not carry, and the verdict on the step it just reported.

A suggest is a question the trial cannot go on without: when no answer comes within
`SUGGEST_WAIT_S` (the driver gone, its broker away past the outage limit), or the driver
says the attempt is no longer its own, the attempt ends as a lost one (`AttemptLost`), and
the driver's protocol re-sends it (never tells it twice). A verdict can wait less: without
one within `JUDGE_WAIT_S`, `should_prune()` reads the prune flag as before.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from trialq.wire.channel import TrialAddress
from trialq.wire.suggest import Distribution, Question, QuestionChannel, Unanswered

_log = logging.getLogger("trialq.suggest")

SUGGEST_WAIT_S = 300.0
"""How long a suggest waits for the driver: the default outage limit, which the driver
itself rides out before giving up (`submit-study --outage-limit`)."""

JUDGE_WAIT_S = 10.0
"""How long `should_prune()` waits for the verdict on the step just reported."""


class AttemptLost(BaseException):
    """The driver cannot answer this attempt: it ends as a lost worker's attempt does
    (`worker_lost`, re-sent within `max_retries`). A BaseException, so a trial's own
    `except Exception` does not swallow it."""


class Questions(Protocol):
    """Who answers a trial's suggests and verdicts: the driver over Redis, or a stand-in
    (`trialq run-trial` draws here)."""

    def suggest(self, name: str, distribution: Distribution) -> Any: ...

    def judge(self, step: int, value: float) -> bool | None: ...


class DriverQuestions:
    """The driver's answers, asked over the broker."""

    def __init__(
        self,
        channel: QuestionChannel,
        address: TrialAddress,
        suggest_wait_s: float = SUGGEST_WAIT_S,
        judge_wait_s: float = JUDGE_WAIT_S,
    ) -> None:
        self._channel, self._address = channel, address
        self._suggest_wait_s, self._judge_wait_s = suggest_wait_s, judge_wait_s
        self._seq = 0

    def suggest(self, name: str, distribution: Distribution) -> Any:
        """The value the driver's sampler gives `name` on this trial; `ValueError` in
        Optuna's words where Optuna refuses it; `AttemptLost` where no answer can come."""
        question = Question(self._address, self._next(), "suggest", name, distribution)
        try:
            answer = self._channel.ask(question, self._suggest_wait_s)
        except Unanswered as exc:
            raise AttemptLost(f"suggest {name!r}: {exc}") from None
        if answer.lost:
            raise AttemptLost(f"suggest {name!r}: {answer.error}")
        if answer.error is not None:
            raise ValueError(answer.error)
        return answer.value

    def judge(self, step: int, value: float) -> bool | None:
        """The pruner's verdict on `step` (reported as `value`); None where none came."""
        question = Question(self._address, self._next(), "judge", step=step, value=value)
        try:
            answer = self._channel.ask(question, self._judge_wait_s)
        except Unanswered:
            _log.warning("no verdict on step %d within %g s: the prune flag says", step,
                         self._judge_wait_s)  # fmt: skip
            return None
        return None if answer.lost or answer.error else answer.prune

    def _next(self) -> int:
        self._seq += 1
        return self._seq
