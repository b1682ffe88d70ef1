"""`Answering`: the driver's answers to what its trials ask while they run
(`trialq.wire.suggest`): a param's value, drawn by the study's sampler on the driver's own live
trial (`optuna.Trial.suggest_*`, so the driver stays the study's single writer and its param is
recorded as Optuna records it), and the pruner's verdict on the step just reported.

A thread of its own waits on the broker for questions, so an answer costs a round trip, not a
pass of the loop; it answers only while the loop lets go of the study (`open`: the loop's pause
between passes), so the study, the storage's copy and what is in flight are touched by one
thread at a time. A param drawn is committed before its answer goes: a trial never goes on
with a value the database may not hold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import optuna
import redis
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    json_to_distribution,
)

from trialq.driver._storage.store import TrialStore
from trialq.driver.in_flight import InFlight
from trialq.wire.dispatch import TrialReports
from trialq.wire.suggest import Answer, Question, QuestionChannel

_log = logging.getLogger("trialq.driver")

TAKE_WAIT_S = 0.2
"""One wait on the broker for questions: how soon the thread sees the run end."""

NOT_IN_FLIGHT = "this attempt is no longer in flight (re-sent, or told)"


class Answering:
    """The thread that answers trials' questions, and the lock it shares with the loop."""

    def __init__(
        self,
        channel: QuestionChannel | None,
        study: str,
        in_flight: Callable[[], Mapping[str, InFlight]],
        store: TrialStore,
        reports: TrialReports,
        clock: Callable[[], float],
        reporting: bool,
    ) -> None:
        self._channel, self._study, self._in_flight = channel, study, in_flight
        self._store, self._reports, self._clock = store, reports, clock
        self._reporting = reporting
        self._lock = threading.Lock()
        """Held by the loop but while it pauses (`open`); the thread answers holding it."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """The loop takes the study; the thread starts waiting for questions."""
        self._lock.acquire()
        if self._channel is None:
            return
        self._thread = threading.Thread(target=self._run, name="trialq-answering", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The run ends: no more answers (an unanswered trial ends as a lost one)."""
        self._stopping.set()
        if self._lock.locked():
            with contextlib.suppress(RuntimeError):
                self._lock.release()
        if self._thread is not None:
            self._thread.join(TAKE_WAIT_S * 10)
        if self._channel is not None:
            self._channel.close()

    @contextlib.contextmanager
    def open(self) -> Iterator[None]:
        """The loop lets go of the study while it pauses: questions are answered meanwhile."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def _run(self) -> None:
        assert self._channel is not None
        while not self._stopping.is_set():
            try:
                questions = self._channel.take(self._study, TAKE_WAIT_S)
            except redis.RedisError:  # the loop meets the outage too; ask again after a while
                self._stopping.wait(TAKE_WAIT_S)
                continue
            if not questions:
                continue
            with self._lock:
                if self._stopping.is_set():
                    return
                answers = self.answer_all(questions)
            if answers is None:  # the storage away: asked again once it may be back
                self._stopping.wait(TAKE_WAIT_S)
                with contextlib.suppress(redis.RedisError):
                    self._channel.ask_again(questions)
                continue
            for question, answer in answers:
                with contextlib.suppress(redis.RedisError):  # the trial asks again
                    self._channel.answer(question, answer)

    def answer_all(self, questions: list[Question]) -> list[tuple[Question, Answer]] | None:
        """Each question's answer; params drawn are committed before any answer goes. None
        where the commit failed: the questions wait for the storage (their trials wait up
        to `driver_questions.SUGGEST_WAIT_S`, as the driver waits out an outage)."""
        by_address = {entry.address: entry for entry in self._in_flight().values()}
        answers = [(q, self._answer(q, by_address.get(q.address))) for q in questions]
        if any(q.kind == "suggest" and a.error is None for q, a in answers):
            try:
                self._store.flush()
            except Exception as exc:  # the storage away: the trial asks again, later
                _log.warning("a suggested param not written, not answered yet: %s", exc)
                return None
        return answers

    def _answer(self, question: Question, entry: InFlight | None) -> Answer:
        if entry is None:
            return Answer(error=NOT_IN_FLIGHT, lost=True)
        try:
            if question.kind == "suggest":
                return _suggested(entry.trial, question)
            return self._judged(entry, question)
        except Exception as exc:  # a sampler's or pruner's bug: said, the thread goes on
            _log.exception("a trial's question not answered")
            return Answer(error=f"the driver could not answer: {type(exc).__name__}: {exc}")

    def _judged(self, entry: InFlight, question: Question) -> Answer:
        """The pruner's verdict on the step reported (recorded first, as Optuna's
        `trial.report` would have); no for several objectives, which Optuna does not prune."""
        if not self._reporting or question.step is None or question.value is None:
            return Answer(prune=False)
        self._store.record_intermediate(entry.trial, question.step, question.value)
        prune = bool(entry.trial.should_prune())  # a pruner may say it as numpy's bool
        if prune and entry.prune_requested_at is None:
            with contextlib.suppress(Exception):  # the flag is a fallback only
                self._reports.request_prune(entry.address)
            entry.prune_requested_at = self._clock()
        return Answer(prune=prune)


def _suggested(trial: optuna.Trial, question: Question) -> Answer:
    """`trial.suggest_*` for the question's name and distribution: the sampler's value,
    recorded on the trial; Optuna's refusal in its own words."""
    try:
        distribution = json_to_distribution(json.dumps(question.distribution))
        assert question.name is not None
        value = suggest(trial, question.name, distribution)
    except (ValueError, TypeError, KeyError, AssertionError) as exc:
        return Answer(error=f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc))
    return Answer(value=value)


def suggest(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> Any:
    """Optuna's own `suggest_*` call for a distribution."""
    if isinstance(distribution, FloatDistribution):
        return trial.suggest_float(name, distribution.low, distribution.high,
                                   step=distribution.step, log=distribution.log)  # fmt: skip
    if isinstance(distribution, IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high,
                                 step=distribution.step, log=distribution.log)  # fmt: skip
    if isinstance(distribution, CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    raise ValueError(f"{type(distribution).__name__} is not a distribution trialq suggests")
