"""What a trial asks its driver while it runs, and the answers: a param's value
(`trial.suggest_*` for a name its task did not carry) and the verdict on the step just
reported (`trial.should_prune()`).

A trial pushes a `Question` onto its study's list (`keys.suggest_key`); the driver's
answering thread pops it, answers from the live Optuna trial, and pushes the `Answer` onto
the asking attempt's own key (`trial_key(..., ANSWER + seq)`), on which the trial waits
(BLPOP), bounded. Both are JSON; with the deployment's secret both are signed
(`trialq.wire.signing`): a question that does not verify is not answered, an answer that does
not verify is none. Asking twice is harmless: Optuna hands a trial's recorded param back, and
a step's value recorded again is the same value.

Distributions travel as Optuna's own JSON (`optuna.distributions.distribution_to_json`), built
here without Optuna: the trial side never imports it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import redis

from trialq.wire.channel import TrialAddress, _client_with_timeout
from trialq.wire.keys import ANSWER, DEFAULT_KEY_TTL_S, suggest_key
from trialq.wire.signing import Seal

_log = logging.getLogger("trialq.suggest")

Distribution = dict[str, Any]
"""A distribution as Optuna writes it in JSON: `{"name": ..., "attributes": {...}}`."""

BLOCK_S = 1.0
"""One wait on Redis for an answer or a question; a longer wait is several of them, so an
outage or a stop is seen within this."""

MAX_TAKEN = 100
"""Questions the driver takes in one round trip at most."""

SIGNATURE = "sig"


def float_distribution(low: float, high: float, step: float | None, log: bool) -> Distribution:
    """`optuna.distributions.FloatDistribution(low, high, step=step, log=log)`, as JSON."""
    attributes = {"low": float(low), "high": float(high), "log": bool(log),
                  "step": None if step is None else float(step)}  # fmt: skip
    return {"name": "FloatDistribution", "attributes": attributes}


def int_distribution(low: int, high: int, step: int, log: bool) -> Distribution:
    """`optuna.distributions.IntDistribution(low, high, step=step, log=log)`, as JSON."""
    attributes = {"low": int(low), "high": int(high), "log": bool(log), "step": int(step)}
    return {"name": "IntDistribution", "attributes": attributes}


def categorical_distribution(choices: Sequence[Any]) -> Distribution:
    """`optuna.distributions.CategoricalDistribution(choices)`, as JSON."""
    return {"name": "CategoricalDistribution", "attributes": {"choices": list(choices)}}


@dataclass(frozen=True)
class Question:
    """One question of one attempt: `suggest` a param (`name`, `distribution`), or `judge`
    the step just reported (`step`, `value`: the report itself, so the verdict needs no read
    of the report stream). `seq` numbers the attempt's questions: its answer's key."""

    address: TrialAddress
    seq: int
    kind: Literal["suggest", "judge"]
    name: str | None = None
    distribution: Distribution | None = None
    step: int | None = None
    value: float | None = None

    def body(self) -> dict[str, Any]:
        """The question as JSON, unsigned."""
        study, number, attempt = self.address.parts
        return {"study": study, "study_key": self.address.study_key, "number": number,
                "attempt": attempt, "seq": self.seq, "kind": self.kind, "name": self.name,
                "distribution": self.distribution, "step": self.step,
                "value": self.value}  # fmt: skip

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Question:
        """A question from its JSON; `ValueError` (or `KeyError`, `TypeError`) if malformed."""
        kind = body["kind"]
        if kind not in ("suggest", "judge"):
            raise ValueError(f"unknown kind {kind!r}")
        key = body.get("study_key")  # the attempt's keys are named by it, as its reports are
        address = TrialAddress(str(body["study"]), int(body["number"]), int(body["attempt"]),
                               None if key is None else str(key))  # fmt: skip
        step, value = body.get("step"), body.get("value")
        return cls(address, int(body["seq"]), kind, body.get("name"), body.get("distribution"),
                   None if step is None else int(step),
                   None if value is None else float(value))  # fmt: skip

    def answer_key(self) -> str:
        """Where its answer goes: a key of the asking attempt."""
        return self.address.key(f"{ANSWER}{self.seq}")


@dataclass(frozen=True)
class Answer:
    """The driver's answer: the param's `value`, or the verdict `prune`; or `error`, in
    Optuna's words (a name asked with another distribution) or the driver's (the attempt is
    no longer in flight)."""

    value: Any = None
    prune: bool = False
    error: str | None = None
    lost: bool = False
    """The driver holds no such attempt (re-sent, or told): its process should end as a lost
    one does, and the driver's protocol takes it from there."""

    def body(self) -> dict[str, Any]:
        return {"value": self.value, "prune": self.prune, "error": self.error, "lost": self.lost}


class Unanswered(Exception):
    """No answer came within the wait: the driver is gone, or its broker was away too long."""


@dataclass
class QuestionChannel:
    """Both ends: the trial asks and waits (`ask`), the driver takes and answers."""

    client: redis.Redis
    seal: Seal | None = None
    key_ttl_s: int = DEFAULT_KEY_TTL_S
    answers_signed: bool = True
    """Whether the driver signs its answers: a trial with a seal refuses an unsigned one
    only then (a driver without the secret signs nothing, as its results say)."""
    _blocking: redis.Redis | None = field(default=None, repr=False)

    def _waiter(self) -> redis.Redis:
        """A client of its own whose replies may take a whole `BLOCK_S` and more."""
        if self._blocking is None:
            self._blocking = _client_with_timeout(self.client, BLOCK_S + 5.0)
        return self._blocking

    # The trial's end.

    def ask(self, question: Question, wait_s: float) -> Answer:
        """Ask and wait up to `wait_s` for the answer; `Unanswered` if none came (asked
        again after each failure to reach Redis, harmless as said above)."""
        deadline = time.monotonic() + wait_s
        asked = False
        while (left := deadline - time.monotonic()) > 0:
            try:
                if not asked:
                    self._push(question)
                    asked = True
                popped: Any = self._waiter().blpop([question.answer_key()], min(BLOCK_S, left))
            except redis.RedisError:
                asked = False
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            if popped is not None:
                answer = self._trusted_answer(question, popped[1])
                if answer is not None:
                    return answer
        raise Unanswered(f"no answer from the driver within {wait_s:g} s")

    def _push(self, question: Question) -> None:
        body = question.body()
        message = {**body, SIGNATURE: self._sign("question", body)}
        pipe = self.client.pipeline(transaction=False)
        key = suggest_key(question.address.study_key or question.address.study)  # as reports
        pipe.delete(question.answer_key())  # an earlier process of this attempt's, unread
        pipe.rpush(key, json.dumps(message, separators=(",", ":")))
        pipe.expire(key, self.key_ttl_s)
        pipe.execute()

    def _trusted_answer(self, question: Question, raw: bytes | str) -> Answer | None:
        try:
            message = json.loads(raw)
            signature = message.pop(SIGNATURE, None)
            body = {k: message.get(k) for k in ("value", "prune", "error", "lost")}
        except (ValueError, AttributeError):
            _log.warning("an answer refused: not a JSON object")
            return None
        if self.seal is not None and self.answers_signed:
            refusal = self.seal.refusal("answer", [question.body(), body], signature)
            if refusal is not None:
                _log.warning("an answer refused: %s", refusal)
                return None
        return Answer(body["value"], bool(body["prune"]), body["error"], bool(body["lost"]))

    # The driver's end.

    def take(self, study: str, wait_s: float = BLOCK_S) -> list[Question]:
        """The questions asked of `study`'s driver (`study`: its key on the broker,
        `TrialRequest.study_key`, so that two studies of one name never take each other's),
        waiting up to `wait_s` for the first; raises `redis.RedisError`. One that is malformed
        or does not verify is said in the log and dropped: its trial asks in vain and ends as
        a lost attempt."""
        key = suggest_key(study)
        first: Any = self._waiter().blpop([key], wait_s)
        if first is None:
            return []
        rest: Any = self.client.lpop(key, MAX_TAKEN - 1) or []
        questions = []
        for raw in [first[1], *rest]:
            question = self._trusted_question(raw)
            if question is not None:
                questions.append(question)
        return questions

    def ask_again(self, questions: list[Question]) -> None:
        """Put questions taken and not answered back on their list (the driver could not
        answer them yet); raises `redis.RedisError`."""
        for question in questions:
            self._push(question)

    def answer(self, question: Question, answer: Answer) -> None:
        """Push the answer where the asking attempt waits; raises `redis.RedisError`."""
        body = answer.body()
        message = {**body, SIGNATURE: self._sign("answer", [question.body(), body])}
        pipe = self.client.pipeline(transaction=False)
        pipe.rpush(question.answer_key(), json.dumps(message, separators=(",", ":")))
        pipe.expire(question.answer_key(), self.key_ttl_s)
        pipe.execute()

    def _trusted_question(self, raw: bytes | str) -> Question | None:
        try:
            message = json.loads(raw)
            signature = message.pop(SIGNATURE, None)
            question = Question.parse(message)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            _log.warning("a trial's question refused: malformed (%s)", exc)
            return None
        if self.seal is not None:
            refusal = self.seal.refusal("question", question.body(), signature)
            if refusal is not None:
                _log.warning("a trial's question refused: %s", refusal)
                return None
        return question

    def _sign(self, kind: str, body: Any) -> str | None:
        return None if self.seal is None else self.seal.sign(kind, body)

    def close(self) -> None:
        """Let go of the blocking client's connections."""
        if self._blocking is not None:
            with contextlib.suppress(redis.RedisError):
                self._blocking.close()
