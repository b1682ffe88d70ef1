"""The driver's answering thread against the real Redis and a real Optuna study: a trial's
suggest drawn on the driver's live trial and recorded there, a verdict on the step just
reported, an attempt no longer in flight told it is lost, a loop that holds the study
answered only once it lets go."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import optuna
import pytest
import redis
from trial_requests import trial_request

from trialq.driver._storage.store import store_for
from trialq.driver.answering import Answering
from trialq.driver.in_flight import InFlight
from trialq.trial.driver_questions import AttemptLost, DriverQuestions
from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.signing import Seal
from trialq.wire.suggest import categorical_distribution, float_distribution

pytestmark = pytest.mark.integration

SEAL = Seal("q" * 32)


@pytest.fixture
def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    return optuna.create_study(study_name="answered", direction="maximize", pruner=pruner)


@pytest.fixture
def running(study: optuna.Study, redis_url: str) -> Iterator[tuple[Answering, InFlight]]:
    """A study with one finished trial and one in flight, and the thread answering for it."""
    done = study.ask()
    done.suggest_float("x", 0, 1)
    done.report(1.0, 0)
    study.tell(done, 1.0)
    live = study.ask()
    entry = InFlight(live, trial_request(study="answered", number=live.number), "task-1")
    channel = ReportChannel(redis.Redis.from_url(redis_url), seal=SEAL)
    answering = Answering(channel.questions(), "answered", lambda: {"task-1": entry},
                          store_for(study), channel, lambda: 0.0, reporting=True)  # fmt: skip
    answering.start()
    try:
        yield answering, entry
    finally:
        answering.stop()


def _asker(redis_url: str, number: int, wait_s: float = 5.0) -> DriverQuestions:
    channel = ReportChannel(redis.Redis.from_url(redis_url), seal=SEAL).questions()
    return DriverQuestions(channel, TrialAddress("answered", number, 1), wait_s, wait_s)


def test_a_suggest_is_drawn_on_the_live_trial_and_recorded_there(
    running: tuple[Answering, InFlight], redis_url: str
) -> None:
    answering, entry = running
    asker = _asker(redis_url, entry.trial.number)
    with answering.open():
        value = asker.suggest("lr", float_distribution(1e-4, 1e-1, None, True))
        again = asker.suggest("lr", float_distribution(1e-4, 1e-1, None, True))
        with pytest.raises(ValueError, match="Cannot set different distribution kind"):
            asker.suggest("lr", categorical_distribution(["a", "b"]))

    assert 1e-4 <= value <= 1e-1
    assert again == value, "Optuna hands a trial's recorded param back"
    assert entry.trial.params == {"lr": value}
    assert entry.trial.distributions["lr"] == optuna.distributions.FloatDistribution(
        1e-4, 1e-1, log=True
    )


def test_the_verdict_is_on_the_step_just_reported(
    running: tuple[Answering, InFlight], redis_url: str
) -> None:
    answering, entry = running
    asker = _asker(redis_url, entry.trial.number)
    with answering.open():
        assert asker.judge(0, 2.0) is False, "above the median of the finished trial"
    assert entry.trial._cached_frozen_trial.intermediate_values == {0: 2.0}
    assert entry.prune_requested_at is None
    with answering.open():
        assert asker.judge(0, 0.5) is True, "reported again below it: pruned at once"
    assert entry.trial._cached_frozen_trial.intermediate_values == {0: 0.5}
    assert entry.prune_requested_at is not None, "the flag raised too, the fallback"


def test_an_attempt_not_in_flight_is_told_it_is_lost(
    running: tuple[Answering, InFlight], redis_url: str
) -> None:
    answering, _ = running
    with answering.open(), pytest.raises(AttemptLost, match="no longer in flight"):
        _asker(redis_url, 99).suggest("x", float_distribution(0, 1, None, False))


def test_no_answer_comes_while_the_loop_holds_the_study(
    running: tuple[Answering, InFlight], redis_url: str
) -> None:
    """The loop holds the study but while it pauses: a question asked meanwhile is answered
    once it lets go, not before."""
    answering, entry = running
    got: list[object] = []
    asker = _asker(redis_url, entry.trial.number)
    thread = threading.Thread(
        target=lambda: got.append(asker.suggest("y", float_distribution(0, 1, None, False)))
    )
    thread.start()
    thread.join(1.0)
    assert got == [] and "y" not in entry.trial.params, "answered while the loop held it"
    with answering.open():
        thread.join(5.0)
    assert len(got) == 1 and entry.trial.params["y"] == got[0]
