"""`[study] ask_processes` with its real processes (issue 42): the pool draws, the driver
adopts the draws as new trials, a process that dies leaves the run to the driver, and none
outlives the run. The driver talks to the stand-in dispatcher (tests/stand_in.py) on SQLite."""

from __future__ import annotations

import logging
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import optuna
import psutil
import pytest
from stand_in import StandInDispatcher

from trialq.driver._storage.store import store_for
from trialq.driver.asking.pool import AskPool
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.progress import NoProgress
from trialq.driver.sending import Sender
from trialq.driver.study import open_study, release_connections
from trialq.spec import StudySpec, load_spec
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.messages import Outcome

pytestmark = pytest.mark.slow  # each starts Python processes that import Optuna
TrialState = optuna.trial.TrialState
WAIT_S = 60.0


def _spec(tmp_path: Path, n_trials: int) -> StudySpec:
    path = tmp_path / "study.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "asked-apart"
            direction = "minimize"
            n_trials = {n_trials}
            max_in_flight = 4
            sampler = "tpe"
            sampler_args = {{ seed = 5 }}
            ask_processes = 2
            [trial]
            entrypoint = "trials:quadratic"
            [space.x]
            type = "float"
            low = -1
            high = 1
            [space.layers]
            type = "int"
            low = 1
            high = 8
            """
        )
    )
    return load_spec(path)


def _askers() -> list[psutil.Process]:
    """This test process's ask processes."""
    children = psutil.Process().children(recursive=True)
    return [p for p in children if "trialq.driver.asking.asker" in " ".join(_cmdline(p))]


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _past_its_start(spec: StudySpec, tmp_path: Path) -> optuna.Study:
    """The spec's study on SQLite with 12 trials told: past the start the driver makes."""
    study = open_study(spec, f"sqlite:///{tmp_path / 'asked.db'}")
    for _ in range(12):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(-1, 1)})
        study.tell(trial, trial.params["x"] ** 2)
    return study


def _until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}"
        time.sleep(0.02)


def test_the_pool_draws_and_the_study_adopts_a_draw_as_its_next_trial(tmp_path: Path) -> None:
    spec = _spec(tmp_path, 100)
    study = _past_its_start(spec, tmp_path)
    pool = AskPool(spec, study, 2)
    try:
        adopted: list[optuna.Trial] = []

        def drawn() -> bool:
            pool.sync(study, 4)
            trial = pool.take(study, store_for(study))
            adopted.extend([trial] if trial is not None else [])
            return bool(adopted)

        _until(drawn, "a draw from the ask processes")
        (trial,) = adopted
        stored = study._storage.get_trial(trial._trial_id)
        assert (trial.number, stored.state) == (12, TrialState.RUNNING)
        assert set(stored.params) == {"x", "layers"} and -1 <= stored.params["x"] <= 1
        assert pool.drawn == 1 and len(_askers()) == 2
    finally:
        pool.close()
        release_connections(study)
    assert _askers() == [], "an ask process outlived its pool"


class _Gated(StandInDispatcher):
    """Trials end at once, except while `hold()` says to keep them running."""

    def __init__(self, script: list[dict[str, object]], hold: Callable[[], bool]) -> None:
        super().__init__(script)
        self.hold = hold

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        if self.hold():
            return {task_id: TaskStatus(TaskPhase.RUNNING) for task_id in task_ids}
        return super().statuses(task_ids)


def _driver(tmp_path: Path, n_trials: int, hold: Callable[[StudyDriver], bool]) -> StudyDriver:
    spec = _spec(tmp_path, n_trials)
    study = open_study(spec, f"sqlite:///{tmp_path / 'asked.db'}")
    script: list[dict[str, object]] = [
        {"outcome": Outcome.OK, "metrics": {"value": float(i % 7)}} for i in range(n_trials)
    ]
    holder: list[StudyDriver] = []
    dispatcher = _Gated(script, lambda: hold(holder[0]))
    options = DriverOptions(max_in_flight=4, poll_interval_s=0.01)
    holder.append(StudyDriver(spec, study, dispatcher, NoProgress(), options))
    return holder[0]


class _UntilDrawn:
    """Past the driver's own start (10 trials), trials wait for the ask processes' first draw
    (bounded: a slow machine's start of them fails the test, it does not hang it)."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + WAIT_S

    def __call__(self, driver: StudyDriver) -> bool:
        pool = driver.sender.new_trials.pool
        if driver.counts.finished < 10 or pool is None or pool.ready or pool.drawn:
            return False
        return time.monotonic() < self.deadline


def _run_logged(driver: StudyDriver, n: int, caplog: pytest.LogCaptureFixture) -> None:
    """Run the study to `n` with the driver's warnings caught; each trial told once."""
    try:
        with caplog.at_level(logging.WARNING, logger="trialq.driver"):
            driver.run()
        _told_once(driver, n)
    finally:
        release_connections(driver.study)


def _told_once(driver: StudyDriver, n: int) -> None:
    trials = driver.study.get_trials()
    assert [t.number for t in trials] == list(range(n))
    assert {t.state for t in trials} == {TrialState.COMPLETE}
    assert len({t.user_attrs["task_id"] for t in trials}) == n
    assert all(set(t.params) == {"x", "layers"} for t in trials)


def test_a_run_with_ask_processes_tells_each_trial_once_and_takes_their_draws(
    tmp_path: Path,
) -> None:
    driver = _driver(tmp_path, 60, _UntilDrawn())
    try:
        driver.run()
        _told_once(driver, 60)
        assert driver.sender.new_trials.pool is not None and driver.sender.new_trials.pool.drawn > 0
    finally:
        release_connections(driver.study)
    assert _askers() == [], "an ask process outlived the run"


def test_an_ask_process_killed_mid_run_leaves_the_asking_to_the_driver(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Both ask processes killed once 20 trials are in: the driver asks the rest itself."""
    until_drawn, killed = _UntilDrawn(), list[psutil.Process]()

    def kill_at_twenty(driver: StudyDriver) -> bool:
        if driver.counts.finished >= 20 and not killed:
            killed.extend(_askers())
            for process in killed:
                process.kill()
        return until_drawn(driver)

    driver = _driver(tmp_path, 60, kill_at_twenty)
    _run_logged(driver, 60, caplog)
    assert len(killed) == 2
    stopped = [r.getMessage() for r in caplog.records if "ask process" in r.getMessage()]
    assert len(stopped) == 2 and all("the driver asks in its place" in m for m in stopped)


def test_a_trial_waiting_in_the_study_goes_before_any_draw(tmp_path: Path) -> None:
    """A WAITING trial (enqueued, or given back by an earlier run) is the driver's own ask's
    to send: a ready draw waits behind it."""
    spec = _spec(tmp_path, 100)
    study = _past_its_start(spec, tmp_path)
    sender = Sender(spec, study, StandInDispatcher([]), store_for(study), time.monotonic, None)
    sender.new_trials.start_asking(1)
    pool = sender.new_trials.pool
    assert pool is not None
    try:
        _until(lambda: pool.sync(study, 1) or pool.ready == 1, "a draw ready")
        study.enqueue_trial({"x": 0.125, "layers": 3})

        first, second = sender.new_trials.ask(), sender.new_trials.ask()

        assert first.params == {"x": 0.125, "layers": 3} and pool.drawn == 1
        assert second.number == first.number + 1 and second.params != first.params
    finally:
        pool.close()
        release_connections(study)


def test_ask_processes_that_cannot_start_leave_the_run_to_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-such-python"))
    driver = _driver(tmp_path, 20, lambda driver: False)
    _run_logged(driver, 20, caplog)
    assert driver.sender.new_trials.pool is None
    assert any("ask processes not started" in r.getMessage() for r in caplog.records)
