"""`[study] ask_ahead`: trials asked before there is room for them, once the sends are out, so
a slow ask (GP: up to seconds) delays no trial's start (issue 42, item 2). With the stand-in
dispatcher (tests/stand_in.py) on SQLite: what is asked ahead and never sent goes back to the
study as WAITING with its params, and the next run sends those first; none lost, none twice."""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import optuna
import pytest
from stand_in import StandInDispatcher

from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.progress import Counts, NoProgress
from trialq.driver.study import open_study
from trialq.errors import Interrupted
from trialq.spec import load_spec
from trialq.wire.messages import Outcome

TrialState = optuna.trial.TrialState


def _driver(
    tmp_path: Path, n_trials: int, ask_ahead: int, values: list[float], more: str = "",
    progress: NoProgress | None = None,
) -> StudyDriver:  # fmt: skip
    path = tmp_path / "study.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "ahead"
            n_trials = {n_trials}
            max_in_flight = 1
            ask_ahead = {ask_ahead}
            sampler = "random"
            {more}
            [trial]
            entrypoint = "trials:quadratic"
            [space.x]
            type = "float"
            low = 0
            high = 1
            """
        )
    )
    spec = load_spec(path)
    study = open_study(spec, f"sqlite:///{tmp_path / 'ahead.db'}")
    script: list[dict[str, object]] = [
        {"outcome": Outcome.OK, "metrics": {"value": v}} for v in values
    ]
    options = DriverOptions(max_in_flight=1, poll_interval_s=0)
    return StudyDriver(spec, study, StandInDispatcher(script), progress or NoProgress(), options)


@pytest.mark.parametrize("ask_ahead", [0, 1])
def test_each_trial_after_the_first_is_asked_while_the_one_before_runs(
    tmp_path: Path, ask_ahead: int
) -> None:
    """One in flight: with `ask_ahead = 1` each next trial exists (asked) before the one
    before it is told; without, only after. The study ends at its budget with nothing over."""
    driver = _driver(tmp_path, 4, ask_ahead, [0.4, 0.3, 0.2, 0.1])

    driver.run()

    trials = driver.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    for before, after in itertools.pairwise(trials):
        assert before.datetime_complete is not None and after.datetime_start is not None
        asked_while_it_ran = after.datetime_start < before.datetime_complete
        assert asked_while_it_ran == bool(ask_ahead), (before, after)


def test_trials_asked_ahead_go_back_waiting_at_a_goal_and_the_next_run_sends_them_first(
    tmp_path: Path,
) -> None:
    driver = _driver(tmp_path, 3, 2, [0.1], more='direction = "minimize"\n            goal = 0.5')

    driver.run()

    trials = driver.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.WAITING,
                                         TrialState.WAITING]  # fmt: skip
    asked = {t.number: t.params for t in trials[1:]}
    assert all(params.keys() == {"x"} for params in asked.values()), asked

    resumed = _driver(tmp_path, 3, 2, [0.3, 0.2])
    resumed.run()

    trials = resumed.study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert {t.number: t.params for t in trials[1:]} == asked, "the asks given back were not run"


class _InterruptAfterOne(NoProgress):
    def update(self, counts: Counts, best: float | None, running: int) -> None:
        if counts.finished >= 1:
            raise KeyboardInterrupt


def test_trials_asked_ahead_go_back_waiting_on_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C after the first tell: the trial sent stays RUNNING with its task id (the next
    run re-attaches it, as any trial in flight); the one asked ahead goes back WAITING."""
    driver = _driver(tmp_path, 5, 2, [0.4, 0.3], progress=_InterruptAfterOne())

    with pytest.raises(Interrupted):
        driver.run()

    study = optuna.load_study(study_name="ahead", storage=f"sqlite:///{tmp_path / 'ahead.db'}")
    trials = study.get_trials()
    assert trials[0].state is TrialState.COMPLETE
    waiting = [t for t in trials if t.state is TrialState.WAITING]
    running = [t for t in trials if t.state is TrialState.RUNNING]
    assert waiting and all(t.params for t in waiting), trials
    assert all(t.user_attrs.get("task_id") for t in running), "RUNNING with no task to follow"
    assert len(trials) == 1 + len(waiting) + len(running) <= 1 + 1 + 2, trials
