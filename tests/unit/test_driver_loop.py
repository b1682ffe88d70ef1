"""The driver's ask/tell loop with an in-process stand-in dispatcher (no Celery, no Redis).

The real path is covered by the integration tests; this one drives outcomes that cannot be
produced on a machine without a GPU, such as a worker refusing a trial for a dirty device.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from pathlib import Path

import optuna

from trialq.dispatch import TaskPhase, TaskStatus
from trialq.driver import DriverOptions, StudyDriver
from trialq.messages import Outcome, TrialRequest, TrialResult
from trialq.progress import NoProgress
from trialq.spec import load_spec
from trialq.study import open_study


class StandInDispatcher:
    """Answers each submitted attempt with the next scripted result, at once."""

    def __init__(self, script: list[dict[str, object]]) -> None:
        self.script = script
        self.sent: dict[str, TrialRequest] = {}

    def submit(
        self, request: TrialRequest, queue: str, hard_limit_s: float, task_id: str | None = None
    ) -> str:
        assert task_id is not None, "the driver names each attempt before sending it"
        self.sent[task_id] = request
        return task_id

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        found = {}
        for task_id in task_ids:
            request = self.sent[task_id]
            fields = self.script[list(self.sent).index(task_id)]
            result = TrialResult(
                study=request.study, number=request.number, attempt=request.attempt, **fields
            )
            found[task_id] = TaskStatus(TaskPhase.FINISHED, result=result)
        return found

    def pending_ids(self, queue: str) -> set[str]:
        return set()

    def worker_alive(self, worker: str) -> bool:
        return True

    def withdraw(self, task_ids: Iterable[str], queue: str) -> None:
        pass

    def terminate(self, task_id: str) -> None:
        pass

    def live_worker_count(self, queue: str) -> int:
        return 1


def _driver(
    tmp_path: Path,
    script: list[dict[str, object]],
    dispatcher: StandInDispatcher | None = None,
) -> tuple[StudyDriver, StandInDispatcher]:
    """A driver of a one-trial study in `tmp_path`; with `dispatcher`, on the same broker."""
    path = tmp_path / "study.toml"
    path.write_text(
        textwrap.dedent(
            """
            [study]
            name = "loop"
            n_trials = 1
            [trial]
            entrypoint = "trials:quadratic"
            max_retries = 1
            [space.x]
            type = "float"
            low = 0
            high = 1
            """
        )
    )
    spec = load_spec(path)
    study = open_study(spec, "sqlite:///" + str(tmp_path / "loop.db"))
    dispatcher = dispatcher or StandInDispatcher(script)
    options = DriverOptions(max_in_flight=1, poll_interval_s=0)
    return StudyDriver(spec, study, dispatcher, None, NoProgress(), options), dispatcher


def test_a_trial_refused_for_a_dirty_device_is_sent_again_with_the_same_params(
    tmp_path: Path,
) -> None:
    refused = {
        "outcome": Outcome.ERROR,
        "error": "device GPU-0 still holds",
        "device_refused": True,
    }
    driver, dispatcher = _driver(
        tmp_path, [refused, {"outcome": Outcome.OK, "metrics": {"value": 0.5}}]
    )

    driver.run(1)

    (trial,) = driver.study.trials
    assert trial.state is optuna.trial.TrialState.COMPLETE and trial.value == 0.5
    assert trial.user_attrs["attempts"] == 2
    first, second = dispatcher.sent.values()
    assert first.params == second.params and (first.attempt, second.attempt) == (1, 2)


def test_refusals_beyond_max_retries_end_the_trial_as_failed(tmp_path: Path) -> None:
    refused = {
        "outcome": Outcome.ERROR,
        "error": "device GPU-0 still holds",
        "device_refused": True,
    }
    driver, _ = _driver(tmp_path, [refused, refused])

    driver.run(1)

    (trial,) = driver.study.trials
    assert trial.state is optuna.trial.TrialState.FAIL
    assert trial.user_attrs["attempts"] == 2
    assert "device GPU-0 still holds" in trial.user_attrs["error"]


def test_a_trial_asked_but_never_sent_ends_as_failed_and_another_takes_its_place(
    tmp_path: Path,
) -> None:
    driver, _ = _driver(tmp_path, [{"outcome": Outcome.OK, "metrics": {"value": 0.5}}])
    driver.study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    # The driver stops here: the trial's params were never persisted, nothing was sent.

    resumed, dispatcher = _driver(tmp_path, [{"outcome": Outcome.OK, "metrics": {"value": 0.5}}])
    resumed.run(2)

    first, second = resumed.study.trials
    assert first.state is optuna.trial.TrialState.FAIL and first.params == {}
    assert "never sent" in first.user_attrs["error"]
    assert second.state is optuna.trial.TrialState.COMPLETE and second.value == 0.5
    assert [r.number for r in dispatcher.sent.values()] == [1]


def test_a_tell_the_driver_died_before_writing_is_told_by_the_next_run_once(
    tmp_path: Path,
) -> None:
    driver, dispatcher = _driver(tmp_path, [{"outcome": Outcome.OK, "metrics": {"value": 0.5}}])
    storage = "sqlite:///" + str(tmp_path / "loop.db")
    driver._fill(1)  # sent: the trial and its task id are in the database
    driver._collect()  # told, in the driver's memory; the step's write would come next
    # The driver dies here.
    (stored,) = optuna.load_study(study_name="loop", storage=storage).trials
    assert stored.state is optuna.trial.TrialState.RUNNING and "task_id" in stored.user_attrs

    resumed, _ = _driver(tmp_path, [], dispatcher)  # the same broker holds the result
    resumed.run(1)

    (trial,) = optuna.load_study(study_name="loop", storage=storage).trials
    assert trial.state is optuna.trial.TrialState.COMPLETE and trial.value == 0.5
    assert trial.user_attrs["task_id"] == stored.user_attrs["task_id"]
    assert len(dispatcher.sent) == 1, "re-attached and told, not sent again"
    assert resumed.counts.complete == 1
