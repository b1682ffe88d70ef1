"""Passes between the driver's full ones read only the trials whose results were announced
(driver/pacing.py; issue 42: a pass read every trial in flight, at 128 in flight most of the
driver's time a trial). Through real workers and the real Redis: each trial still told once,
and what is lost with the announcements (the subscription cut) is found by a full pass."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path

import optuna
import pytest
import redis

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.progress import Counts
from trialq.driver.study import open_study
from trialq.settings import Settings
from trialq.spec import load_spec
from trialq.wire.dispatch import TaskStatus

pytestmark = pytest.mark.integration

N_TRIALS, IN_FLIGHT = 24, 8


class RecordingDispatcher(CeleryDispatcher):
    """Celery's dispatcher, noting how many trials each read of statuses asked for, and how
    many were in flight then (the driver's `in_flight`, set by the test)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.reads: list[int] = []
        self.cut_after: int | None = None
        """Cut the results subscription's connection once this many reads were made."""
        self.broker_url = settings.broker_url
        self.answers: list[set[str] | None] = []

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        ids = list(task_ids)
        self.reads.append(len(ids))
        if self.cut_after is not None and len(self.reads) == self.cut_after:
            _cut_subscriptions(self.broker_url)
        return super().statuses(ids)

    def results_announced(self) -> set[str] | None:
        answer = super().results_announced()
        self.answers.append(answer)
        return answer


def _cut_subscriptions(url: str) -> None:
    """Close the subscriptions on the test's own Redis database (the driver's results
    channel; its workers' too), not those of tests beside it on the same server."""
    client = redis.Redis.from_url(url)
    db = str(client.connection_pool.connection_kwargs.get("db", 0))
    for found in client.client_list(_type="pubsub"):
        if str(found["db"]) == db:
            client.client_kill_filter(_id=found["id"])


class Told:
    """Progress: the finished count after each pass."""

    def __init__(self) -> None:
        self.finished: list[int] = []

    def update(self, counts: Counts, best: float | None, running: int) -> None:
        self.finished.append(counts.finished)

    def trial_failed(self, line: str) -> None:
        raise AssertionError(line)


def _driver(tmp_path: Path, redis_url: str, name: str) -> tuple[StudyDriver, RecordingDispatcher]:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "{name}"
            direction = "maximize"
            metric = "echo"
            n_trials = {N_TRIALS}
            max_in_flight = {IN_FLIGHT}
            sampler = "random"
            [trial]
            entrypoint = "trials:sleeps_then_echoes"
            timeout_s = 60
            [space.sleep_s]
            type = "float"
            low = 0.0
            high = 1.5
            """
        )
    )
    spec = load_spec(path)
    study = open_study(spec, f"sqlite:///{tmp_path / f'{name}.db'}")
    dispatcher = RecordingDispatcher(Settings(broker_url=redis_url))
    options = DriverOptions(max_in_flight=IN_FLIGHT, poll_interval_s=0.5)
    return StudyDriver(spec, study, dispatcher, Told(), options), dispatcher


def _told_once(study: optuna.Study) -> None:
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == N_TRIALS
    assert {t.state for t in trials} == {optuna.trial.TrialState.COMPLETE}
    assert len({t.user_attrs["task_id"] for t in trials}) == N_TRIALS
    assert all(t.user_attrs["attempts"] == 1 for t in trials)


def test_a_result_brings_a_pass_that_reads_its_own_trial_not_all_in_flight(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., object]
) -> None:
    """Full passes half a second apart; the results in between each bring a pass that reads
    the announced trials only, while up to 8 are in flight."""
    start_workers(4)
    driver, dispatcher = _driver(tmp_path, redis_url, "announced")

    driver.run()

    _told_once(driver.study)
    targeted = [n for n in dispatcher.reads if 0 < n < 4]
    full = [n for n in dispatcher.reads if n >= 4]
    assert targeted, f"every pass read every trial in flight: {dispatcher.reads}"
    assert len(targeted) >= N_TRIALS // 4, dispatcher.reads
    assert full, f"no full pass (a crash or a lost worker would never be seen): {dispatcher.reads}"


def test_results_announced_while_the_subscription_was_cut_are_told_by_a_full_pass(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., object]
) -> None:
    start_workers(4)
    driver, dispatcher = _driver(tmp_path, redis_url, "cut")
    dispatcher.cut_after = 6

    driver.run()

    _told_once(driver.study)
    after_cut = dispatcher.answers[6:]
    assert None in after_cut, f"the cut went unnoticed: {after_cut}"
    assert any(after_cut[after_cut.index(None):]), "no announcement heard after the cut"
