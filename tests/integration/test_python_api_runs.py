"""`trialq.optimize` from a script: a study on local workers (or a broker's), the
`optuna.Study` back, TensorBoard's records of every trial read back with its own
EventAccumulator; Ctrl-C as on the command line."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import trials
from waiting import wait_until

import trialq
from trialq.local import LocalCluster
from trialq.settings import redacted_url
from trialq.wire.messages import BROKER_ATTR

pytestmark = pytest.mark.integration

TESTS_DIR = Path(__file__).resolve().parents[1]
SPACE = {"x": {"type": "float", "low": -3, "high": 3}, "act": ["relu", "tanh"]}


def _event_accumulator(folder: Path) -> object:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return accumulator


def _hparams(accumulator: object) -> dict[str, object]:
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    content = accumulator.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content  # type: ignore[attr-defined]
    values = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    return {name: getattr(value, value.WhichOneof("kind")) for name, value in values.items()}


def test_optimize_runs_on_local_workers_and_records_each_trial_in_every_tracker(
    tmp_path: Path,
) -> None:
    """A function object of a module the workers can import, on local workers started and
    stopped by the call; a second call resumes the study and records only its new trials."""
    pytest.importorskip("tensorboard")
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    tracked = {"tensorboard": True, "mlflow": "sqlite:///mlflow.db",
               "wandb": {"mode": "offline", "dir": "wandb-runs"}}  # fmt: skip
    study = trialq.optimize(trials.reports_three, space=SPACE, metric="score", n_trials=3,
                            workers=2, directory=tmp_path, progress=False, **tracked)  # fmt: skip

    assert isinstance(study, optuna.Study)
    assert study.study_name == "reports_three"
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == 3
    assert (tmp_path / "reports_three.db").exists(), "SQLite beside `directory`, as a spec's"
    root = tmp_path / "reports_three-artifacts" / "tensorboard" / "reports_three"
    for trial in complete:
        board = _event_accumulator(root / f"trial-{trial.number:05d}")
        reports = board.Scalars("reports/score")  # type: ignore[attr-defined]
        assert [(r.step, pytest.approx(r.value)) for r in reports] == sorted(
            trial.intermediate_values.items()
        )
        (final,) = board.Scalars("score")  # type: ignore[attr-defined]
        assert final.value == pytest.approx(trial.value)
        assert board.Scalars("aux")[0].value == 1.5  # type: ignore[attr-defined]
        assert board.Scalars("trialq/attempts")[0].value == 1  # type: ignore[attr-defined]
        assert _hparams(board) == pytest.approx(trial.params)

    again = trialq.optimize(trials.reports_three, space=SPACE, metric="score", n_trials=4,
                            workers=1, directory=tmp_path, progress=False, **tracked)  # fmt: skip

    assert len(again.trials) == 4
    assert sorted(p.name for p in root.iterdir()) == [f"trial-{n:05d}" for n in range(4)]
    assert all(len(list(p.iterdir())) == 1 for p in root.iterdir()), "one events file a trial"
    _check_mlflow_runs(mlflow, tmp_path / "mlflow.db", again)
    _check_wandb_runs(tmp_path / "wandb-runs" / "wandb", again)


def _check_wandb_runs(folder: Path, study: optuna.Study) -> None:
    """One offline run per trial, in the study's group, with what the study holds of it."""
    from wandb_records import read_offline_run

    from trialq.tracking.wandb import run_id_of

    runs = {}
    for run_folder in folder.glob("offline-run-*"):
        (log,) = run_folder.glob("*.wandb")
        run = read_offline_run(log)
        assert run.run_id not in runs, "a trial recorded twice"
        runs[run.run_id] = run
    assert sorted(runs) == sorted(run_id_of(study.study_name, t.number) for t in study.trials)
    for trial in study.trials:
        run = runs[run_id_of(study.study_name, trial.number)]
        assert run.group == study.study_name
        assert {k: v for k, v in run.config.items() if k != "_wandb"} == trial.params
        reports = {h["_step"]: pytest.approx(h["reports/score"]) for h in run.history}
        assert reports == trial.intermediate_values
        assert run.summary["score"] == pytest.approx(trial.value)
        assert run.summary["trialq/worker_host"] == trial.user_attrs["worker_host"]


def _check_mlflow_runs(mlflow: Any, db: Path, study: optuna.Study) -> None:
    """One parent run for the study over both calls, one nested run per trial with what the
    study holds of it."""
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(experiment_names=[study.study_name], output_format="list")
    (parent,) = (run for run in runs if run.data.tags["trialq.role"] == "study")
    children = {int(run.data.tags["trialq.trial_number"]): run for run in runs if run != parent}
    assert sorted(children) == [0, 1, 2, 3]
    client = mlflow.MlflowClient()
    for trial in study.trials:
        run = children[trial.number]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.info.status == "FINISHED"
        assert run.data.params == {name: str(value) for name, value in trial.params.items()}
        assert run.data.metrics["score"] == pytest.approx(trial.value)
        assert run.data.tags["trialq.outcome"] == "ok"
        assert run.data.tags["trialq.worker_host"] == trial.user_attrs["worker_host"]
        history = client.get_metric_history(run.info.run_id, "reports/score")
        assert {m.step: pytest.approx(m.value) for m in history} == trial.intermediate_values


def test_optimize_on_a_broker_runs_on_its_workers(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    start_workers(2, queue="gpu")

    study = trialq.optimize("trials:quadratic", space={"x": [0.0, 1.0, 2.0]}, metric="score",
                            n_trials=3, broker=redis_url, name="on-a-broker",
                            directory=tmp_path, progress=False)  # fmt: skip

    assert study.study_name == "on-a-broker"
    assert {t.state for t in study.trials} == {optuna.trial.TrialState.COMPLETE}
    assert study.user_attrs[BROKER_ATTR] == redacted_url(redis_url)


SCRIPT = """
import sys, trialq, trials
try:
    trialq.optimize(trials.sleeps, space={"sleep_s": [0.5, 20.0]}, n_trials=8, workers=2,
                    enqueue=[{"sleep_s": 0.5}], progress=False)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(130)
"""


def test_ctrl_c_in_a_script_stops_the_run_as_on_the_command_line(tmp_path: Path) -> None:
    """The interrupt withdraws the queued trials, stops the local workers, and reaches the
    caller as `KeyboardInterrupt` (what a notebook shows when its kernel is interrupted)."""
    (tmp_path / "search.py").write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), *sys.path])}
    process = subprocess.Popen([sys.executable, "search.py"], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: _complete_trials(tmp_path / "sleeps.db", process) > 0, 180,
                   "a trial to finish", 0.2)  # fmt: skip
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    assert process.returncode == 130, err
    assert out.splitlines() == ["KeyboardInterrupt"]
    assert "interrupted: queued trials withdrawn; rerun to resume" in err


def _complete_trials(path: Path, process: subprocess.Popen[str]) -> int:
    assert process.poll() is None, process.communicate()
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            done = db.execute("SELECT count(*) FROM trials WHERE state = 'COMPLETE'")
            return int(done.fetchone()[0])
    except sqlite3.Error:
        return 0
