"""Tracking off the driver's loop: a tracker that fails never stops the study,
its records catch up when it answers again or are said missing at the end; a trial
recorded twice is one record; the driver never loads TensorFlow to write TensorBoard's files.
The trackers here are the real libraries on local stores; the driver loop's side is in
tests/integration/test_python_api_runs.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from trialq.tracking import StudyInfo, ToldTrial, Tracking
from trialq.tracking.config import MlflowTracking, TensorboardTracking
from trialq.wire.record import TrialRecord


def _study(tmp_path: Path) -> StudyInfo:
    return StudyInfo(name="s", directions=("maximize",), metric_names=("score",),
                     spec_folder=tmp_path)  # fmt: skip


def _trial(number: int) -> ToldTrial:
    return ToldTrial(
        number=number, state="COMPLETE", params={"x": 0.5 * number, "act": "relu"},
        values=(float(number),), intermediate={0: 0.1, 1: 0.2},
        record=TrialRecord(outcome="ok", attempts=2, worker_host="w1", metrics={"aux": 3}),
        started=datetime(2026, 1, 1, 12, 0, 0), ended=datetime(2026, 1, 1, 12, 0, 5),
    )  # fmt: skip


class FlakyStandIn:
    """A stand-in for a tracking server that is away for its first `failures` calls."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures, self.recorded = failures, []  # type: list[int]

    def start(self, study: StudyInfo) -> None:
        self._maybe_fail()

    def record(self, trial: ToldTrial) -> None:
        self._maybe_fail()
        self.recorded.append(trial.number)

    def close(self) -> None:
        """Nothing to finish."""

    def _maybe_fail(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("connection refused\nsecond line")


def test_a_tracker_that_fails_catches_up_when_it_answers_and_nothing_is_said(
    tmp_path: Path,
) -> None:
    flaky, lines = FlakyStandIn(failures=3), []  # start, then trial 0 once, trial 0 again
    tracking = Tracking([flaky], warn=lines.append)
    tracking.start(_study(tmp_path))

    for number in range(3):
        tracking.told(_trial(number))
    missing = tracking.close()

    assert flaky.recorded == [0, 1, 2], "in order, the missed one first"
    assert missing == {}
    assert lines == []  # nothing was lost: nothing to say


def test_what_never_went_in_is_said_missing_at_the_end(tmp_path: Path) -> None:
    flaky, lines = FlakyStandIn(failures=100), []
    tracking = Tracking([flaky], warn=lines.append)
    tracking.start(_study(tmp_path))
    for number in range(2):
        tracking.told(_trial(number))

    assert tracking.close() == {"flaky": [0, 1]}
    assert lines == [
        "warning: tracking: flaky: not recorded: #0, #1 (the study is whole): connection refused"
    ]


class HangsStandIn(FlakyStandIn):
    """A stand-in for a tracking server that accepts and never answers: every call blocks."""

    name = "silent"

    def _maybe_fail(self) -> None:
        threading.Event().wait()


def test_a_tracker_that_never_answers_holds_the_end_of_the_run_only_until_the_deadline(
    tmp_path: Path,
) -> None:
    lines: list[str] = []
    tracking = Tracking([HangsStandIn(0)], close_wait_s=0.5, warn=lines.append)
    tracking.start(_study(tmp_path))
    tracking.told(_trial(0))

    began = time.monotonic()
    assert tracking.close() == {"silent": [0]}
    assert time.monotonic() - began < 5
    assert lines == [
        "warning: tracking: silent: not recorded: #0 (the study is whole): it did not answer "
        "in time"
    ]
    assert tracking._thread is not None and tracking._thread.daemon  # never joined at exit


@pytest.mark.slow
def test_an_mlflow_server_that_is_down_leaves_tensorboard_and_the_run_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("tensorboard")
    from trialq.tracking.mlflow import MlflowTracker
    from trialq.tracking.tensorboard import TensorboardTracker

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once, not retried
    lines: list[str] = []
    down = MlflowTracker(MlflowTracking(tracking_uri="http://127.0.0.1:1"))
    board = TensorboardTracker(TensorboardTracking(log_dir="tb"))
    tracking = Tracking([down, board], warn=lines.append)
    tracking.start(_study(tmp_path))
    tracking.told(_trial(0))

    assert tracking.close() == {"mlflow": [0]}
    assert (tmp_path / "tb" / "trial-00000" / "events.out.tfevents.trialq").is_file()
    assert [line.split(":")[:4] for line in lines] == [
        ["warning", " tracking", " mlflow", " not recorded"]
    ]


@pytest.mark.slow
def test_an_mlflow_trial_recorded_again_is_one_run_under_one_parent(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    from trialq.tracking.mlflow import MlflowTracker

    config = MlflowTracking(tracking_uri="sqlite:///mlflow.db")
    for _ in range(2):  # a driver restarted on the study: its parent run found again
        tracker = MlflowTracker(config)
        tracker.start(_study(tmp_path))
        tracker.record(_trial(0))
        tracker.record(_trial(0))  # a re-sent attempt told once is recorded once
        tracker.close()

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["s"], output_format="list")
    assert sorted(run.data.tags["trialq.role"] for run in runs) == ["study", "trial"]
    (trial,) = (run for run in runs if run.data.tags["trialq.role"] == "trial")
    parent = next(run for run in runs if run.data.tags["trialq.role"] == "study")
    assert trial.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert trial.data.params == {"x": "0.0", "act": "relu"}
    assert trial.data.metrics["score"] == 0.0 and trial.data.metrics["aux"] == 3
    assert trial.data.tags["trialq.outcome"] == "ok"
    assert trial.data.tags["trialq.worker_host"] == "w1"
    history = mlflow.MlflowClient().get_metric_history(trial.info.run_id, "reports/score")
    assert [(m.step, m.value) for m in history] == [(0, 0.1), (1, 0.2)]


def test_the_driver_writes_tensorboard_files_without_loading_tensorflow(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    probe = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_tracking import _study, _trial
from trialq.tracking import Tracking, trackers_for
from trialq.tracking.config import TrackingSection
tracking = Tracking(trackers_for(TrackingSection(tensorboard=True), "spec"))
tracking.start(_study(Path({str(tmp_path)!r})))
tracking.told(_trial(0))
assert tracking.close() == {{}}
print("tensorflow" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert (tmp_path / "s-tensorboard" / "trial-00000" / "events.out.tfevents.trialq").is_file()


@pytest.mark.slow
def test_a_wandb_trial_offline_is_one_run_in_the_study_group(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    from wandb_records import read_offline_run

    from trialq.tracking.config import WandbTracking
    from trialq.tracking.wandb import WandbTracker, run_id_of

    for _ in range(2):  # a driver restarted on the study finds the run this machine wrote
        tracker = WandbTracker(WandbTracking(mode="offline", dir="runs"))
        tracker.start(_study(tmp_path))
        tracker.record(_trial(1))
        tracker.close()

    (folder,) = (tmp_path / "runs" / "wandb").glob("offline-run-*")
    (log,) = folder.glob("*.wandb")
    run = read_offline_run(log)
    assert run.run_id == run_id_of("s", 1) and run.group == "s"
    assert {k: v for k, v in run.config.items() if k != "_wandb"} == {"x": 0.5, "act": "relu"}
    assert [(h["_step"], h["reports/score"]) for h in run.history] == [(0, 0.1), (1, 0.2)]
    assert run.summary["score"] == 1.0 and run.summary["aux"] == 3
    assert run.summary["trialq/outcome"] == "ok" and run.summary["trialq/attempts"] == 2


def test_a_tracker_whose_library_is_missing_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the study starts: exit 2, with the extra that installs it."""
    from trialq.errors import UsageError
    from trialq.tracking import registry
    from trialq.tracking.config import TrackingSection

    (tmp_path / "adapter_of_a_missing_library.py").write_text("import library_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.ADAPTERS, "mlflow", ("adapter_of_a_missing_library",
                                                      "library_not_installed", "mlflow"))  # fmt: skip

    with pytest.raises(UsageError) as refused:
        registry.trackers_for(TrackingSection(mlflow=True), "study.toml")

    assert str(refused.value) == (
        "study.toml: tracking.mlflow: library_not_installed is not installed here "
        "(pip install 'trialq[mlflow]')"
    )
    assert refused.value.exit_code == 2


def test_a_told_trial_carries_its_record_whole_and_trackers_read_its_summary() -> None:
    """What every tracker records of how a trial ran comes from the typed record the driver
    wrote: the summary's fields that are set, no GPU list or unset field."""
    told = _trial(3)
    record = told.record.model_copy(update={"gpu_peaks_bytes": (1, 2), "duration_s": 1.5})

    summary = ToldTrial(**{**told.__dict__, "record": record}).summary_attrs

    assert summary == {
        "state": "COMPLETE", "outcome": "ok", "attempts": 2, "worker_host": "w1",
        "duration_s": 1.5,
    }  # fmt: skip
    assert told.final_metrics == {"aux": 3.0}


@pytest.mark.slow
def test_the_mlflow_study_run_holds_the_best_value_and_its_trial(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    from trialq.tracking.mlflow import BEST_TRIAL_TAG, MlflowTracker

    for numbers in ([2, 0], [3, 1]):  # told out of order, over two runs of the driver
        tracker = MlflowTracker(MlflowTracking(tracking_uri="sqlite:///mlflow.db"))
        tracker.start(_study(tmp_path))
        for number in numbers:  # values 2, 0, then 3, 1: the best is #3's, then not beaten
            tracker.record(_trial(number))
        tracker.close()

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["s"], output_format="list")
    (parent,) = (run for run in runs if run.data.tags["trialq.role"] == "study")
    assert parent.data.metrics["best/score"] == 3.0
    assert parent.data.tags[BEST_TRIAL_TAG] == "3"


def test_a_tensorboard_pruned_trial_is_no_success(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata

    from trialq.tracking.tensorboard import EVENTS_FILE, TensorboardTracker

    board = TensorboardTracker(TensorboardTracking(log_dir="tb"))
    board.start(_study(tmp_path))
    board.record(replace(_trial(0), state="PRUNED", values=None))
    path = tmp_path / "tb" / "trial-00000" / EVENTS_FILE
    events = [event_pb2.Event.FromString(raw) for raw in RawEventFileLoader(str(path)).Load()]
    ends = [
        metadata.parse_session_end_info_plugin_data(value.metadata.plugin_data.content)
        for event in events
        for value in event.summary.value
        if value.tag == metadata.SESSION_END_INFO_TAG
    ]
    assert [end.status for end in ends] == [api_pb2.STATUS_UNKNOWN]


def test_a_wandb_dir_that_cannot_be_written_is_said_not_left_for_a_temporary_folder(
    tmp_path: Path,
) -> None:
    pytest.importorskip("wandb")
    from trialq.tracking.config import WandbTracking
    from trialq.tracking.wandb import WandbTracker

    unwritable = Path("/proc/1")  # even root cannot write there, as W&B's own test finds
    assert not os.access(unwritable, os.W_OK)
    lines: list[str] = []
    tracking = Tracking([WandbTracker(WandbTracking(mode="offline", dir=str(unwritable)))],
                        warn=lines.append)  # fmt: skip
    tracking.start(_study(tmp_path))
    tracking.told(_trial(0))

    assert tracking.close() == {"wandb": [0]}
    assert len(lines) == 1 and "wandb: not recorded: #0" in lines[0], lines
    assert "dir /proc/1 cannot be written" in lines[0], lines
