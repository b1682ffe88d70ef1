"""`trial.mlflow_run_id`: a trial process finds or makes its own nested MLflow run by the
tags the driver's tracker uses, so that every attempt and then the driver land in one run;
MLflow failing in the trial process is one warning line and None, never the trial's failure.
Real MLflow on a SQLite store under tmp_path; the run through real workers is in
tests/integration/test_tracking_mlflow_trial_runs.py."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from trialq.api import study_spec
from trialq.driver.sending import mlflow_target
from trialq.spec import StudySpec
from trialq.tracking import StudyInfo, ToldTrial
from trialq.tracking.config import MlflowTracking
from trialq.trial.context import TrialContext
from trialq.trial.mlflow_run import mlflow_run_id
from trialq.trial.soft_limit import SoftLimitPassed, soft_limit
from trialq.wire.channel import TrialAddress
from trialq.wire.entrypoint import Entrypoint
from trialq.wire.messages import MlflowTarget, TrialRequest
from trialq.wire.record import TrialRecord

mlflow = pytest.importorskip("mlflow")
pytestmark = pytest.mark.slow  # MLflow makes its SQLite tables: seconds


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MlflowTarget]:
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is the current folder's
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # set_tracking_uri sets it
    yield MlflowTarget(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="s")
    mlflow.set_tracking_uri(None)  # the trial process's pointing, undone for later tests


def _study(tmp_path: Path) -> StudyInfo:
    return StudyInfo(name="s", directions=("maximize",), metric_names=("score",),
                     spec_folder=tmp_path)  # fmt: skip


def _told(number: int, state: str = "COMPLETE") -> ToldTrial:
    return ToldTrial(
        number=number, state=state, params={"x": 0.5}, values=(1.0,) if state == "COMPLETE" else None,
        intermediate={0: 0.1}, record=TrialRecord(outcome="ok", attempts=2),
        started=datetime(2026, 1, 1, 12, 0, 0), ended=datetime(2026, 1, 1, 12, 0, 5),
    )  # fmt: skip


def _tracker(target: MlflowTarget, tmp_path: Path) -> Any:
    from trialq.tracking.mlflow import MlflowTracker

    tracker = MlflowTracker(MlflowTracking(tracking_uri=target.tracking_uri))
    tracker.start(_study(tmp_path))
    return tracker


def _trial_runs(target: MlflowTarget) -> list[Any]:
    client = mlflow.MlflowClient(target.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("s").experiment_id])
    return [run for run in runs if run.data.tags["trialq.role"] == "trial"]


def test_every_attempt_finds_the_one_run_the_driver_then_fills(
    target: MlflowTarget, tmp_path: Path
) -> None:
    tracker = _tracker(target, tmp_path)  # the driver started first: the study's run is there

    first = mlflow_run_id(target, "s", 3)
    again = mlflow_run_id(target, "s", 3)  # a re-sent attempt, in a process of its own
    assert first is not None and again == first
    with mlflow.start_run(run_id=first):  # the fluent API points at the study's store
        mlflow.log_metric("user_loss", 0.25)
    tracker.record(_told(3))
    tracker.close()

    (run,) = _trial_runs(target)
    assert run.info.run_id == first
    assert run.data.tags["mlflow.parentRunId"] == tracker.parent_run_id
    assert run.data.tags["mlflow.runName"] == "trial-3"
    assert run.data.metrics["user_loss"] == 0.25 and run.data.metrics["score"] == 1.0
    assert run.data.params == {"x": "0.5"}
    assert run.info.status == "FINISHED"


def test_a_run_made_before_the_studys_gets_its_parent_and_the_trials_end_state(
    target: MlflowTarget, tmp_path: Path
) -> None:
    """The trial came first (the driver's tracker had not started); the user ended the run
    (FINISHED); the trial failed after: the driver fills it, parents it, and ends it FAILED."""
    run_id = mlflow_run_id(target, "s", 0)
    assert run_id is not None
    with mlflow.start_run(run_id=run_id):
        mlflow.log_metric("user_loss", 1.0)
    assert "mlflow.parentRunId" not in mlflow.MlflowClient().get_run(run_id).data.tags

    tracker = _tracker(target, tmp_path)
    tracker.record(_told(0, state="FAIL"))

    (run,) = _trial_runs(target)
    assert run.info.run_id == run_id
    assert run.data.tags["mlflow.parentRunId"] == tracker.parent_run_id
    assert run.data.tags["trialq.recorded"] == "true"
    assert run.data.metrics["user_loss"] == 1.0 and run.data.params == {"x": "0.5"}
    assert run.info.status == "FAILED"


def test_two_attempts_making_the_run_at_once_settle_on_one(target: MlflowTarget) -> None:
    """Another attempt's process makes the trial's run between this one's look-up and its
    own making: the first made is kept by both, the later one deleted."""
    from mlflow.tracking import MlflowClient

    from trialq.tracking import mlflow_runs

    class RacedClient(MlflowClient):
        rival = ""

        def create_run(self, experiment_id: str, *args: Any, **kwargs: Any) -> Any:
            if not self.rival:
                earlier = int(time.time() * 1000) - 1000
                made = super().create_run(experiment_id, start_time=earlier, tags=kwargs["tags"])
                self.rival = made.info.run_id
            return super().create_run(experiment_id, *args, **kwargs)

    client = RacedClient(target.tracking_uri)
    experiment = mlflow_runs.experiment_id(client, "s")

    kept = mlflow_runs.trial_run(client, experiment, "s", 5, parent=None)

    assert kept == client.rival
    assert [run.info.run_id for run in _trial_runs(target)] == [kept]


MAKER = """
import sys
from trialq.trial.mlflow_run import mlflow_run_id
from trialq.trial.soft_limit import SoftLimitPassed, soft_limit
from trialq.wire.messages import MlflowTarget
print(mlflow_run_id(MlflowTarget(tracking_uri=sys.argv[1], experiment="s"), "s", 7))
"""


def test_processes_coming_at_once_to_a_new_sqlite_store_make_it_once_and_one_run(
    target: MlflowTarget,
) -> None:
    """MLflow makes a new SQLite store's tables in each process's first use; three at once
    (the driver and a study's first trials) broke each other before `first_use`."""
    assert target.tracking_uri is not None
    makers = [subprocess.Popen([sys.executable, "-c", MAKER, target.tracking_uri],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(3)]  # fmt: skip
    outputs = [maker.communicate(timeout=120) for maker in makers]

    assert [err for _, err in outputs if "trial.mlflow_run_id is None" in err] == []
    ids = {out.strip() for out, _ in outputs}
    assert ids == {run.info.run_id for run in _trial_runs(target)} and len(ids) == 1


def test_an_mlflow_that_does_not_answer_is_one_warning_line_and_none(
    target: MlflowTarget, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once, not retried
    down = MlflowTarget(tracking_uri="http://127.0.0.1:1", experiment="s")
    context = _context(down)

    with caplog.at_level(logging.WARNING, logger="trialq.mlflow"):
        assert context.mlflow_run_id is None
        assert context.mlflow_run_id is None  # asked again: not again

    (line,) = caplog.messages
    assert line.startswith("trial.mlflow_run_id is None: MLflow at http://127.0.0.1:1 failed: ")
    assert "\n" not in line


def test_the_trials_time_limit_passing_in_the_look_up_is_raised_not_swallowed(
    target: MlflowTarget, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that takes connections and never answers: the soft limit fires inside
    MLflow's request, which MLflow wraps in its own exception; the trial still ends `timeout`."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        hangs = MlflowTarget(tracking_uri=f"http://127.0.0.1:{silent.getsockname()[1]}",
                             experiment="s")  # fmt: skip
        started = time.monotonic()
        with pytest.raises(SoftLimitPassed), soft_limit(0.5):
            mlflow_run_id(hangs, "s", 0)

    assert time.monotonic() - started < 30
    assert not [line for line in caplog.messages if "mlflow_run_id" in line]


def test_an_mlflow_not_installed_in_the_worker_is_one_warning_line_and_none(
    target: MlflowTarget, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` meets without it

    with caplog.at_level(logging.WARNING, logger="trialq.mlflow"):
        assert _context(target).mlflow_run_id is None

    assert caplog.messages == [
        "trial.mlflow_run_id is None: mlflow is not installed in this worker "
        "(pip install 'trialq[mlflow]')"
    ]


def test_a_study_without_mlflow_tracking_has_no_run_and_sends_no_target(tmp_path: Path) -> None:
    assert TrialContext(TrialAddress("s", 0, 1), {}, None).mlflow_run_id is None
    assert mlflow_target(_spec(tmp_path)) is None


def test_the_driver_sends_the_store_the_spec_names_made_absolute(tmp_path: Path) -> None:
    spec = _spec(tmp_path, mlflow="sqlite:///runs/mlflow.db")
    assert mlflow_target(spec) == MlflowTarget(
        tracking_uri=f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}", experiment="st"
    )
    named = _spec(tmp_path, tracking={"mlflow": {"tracking_uri": "http://mlflow:5000",
                                                 "experiment": "digits"}})  # fmt: skip
    assert mlflow_target(named) == MlflowTarget(tracking_uri="http://mlflow:5000",
                                                experiment="digits")  # fmt: skip


def test_the_target_is_a_compatible_field_of_the_request() -> None:
    """An older worker ignores it (extra fields are), a newer one reads None from an older
    driver, and a key a later driver adds to the target is ignored too."""
    base = {"study": "s", "number": 0, "attempt": 1, "params": {},
            "entrypoint": Entrypoint("trials", "quadratic"), "timeout_s": 60}  # fmt: skip
    assert TrialRequest.model_validate(base).mlflow is None
    sent = TrialRequest.model_validate(
        {**base, "mlflow": {"tracking_uri": None, "experiment": "s", "later": 1}}
    ).model_dump(mode="json")
    assert sent["mlflow"] == {"tracking_uri": None, "experiment": "s"}
    assert TrialRequest.model_validate(sent).mlflow == MlflowTarget(experiment="s")


def _spec(folder: Path, **keys: Any) -> StudySpec:
    return study_spec("trials:quadratic", directory=folder, name="st", n_trials=1,
                      space={"x": [1.0]}, metric="score", **keys)  # fmt: skip


def _context(target: MlflowTarget) -> TrialContext:
    return TrialContext(TrialAddress("s", 0, 1), {}, None,
                        mlflow_run=lambda: mlflow_run_id(target, "s", 0))  # fmt: skip
