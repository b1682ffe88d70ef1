"""A trial logging into its own MLflow run (`trial.mlflow_run_id`) through a real study on
local workers: one nested run per trial holds both what the trial logged (a metric, an
artifact) and what the driver recorded (params, values, reports); a re-sent attempt logs
into the same run, and a second call on the study makes no run again."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import trials

import trialq

pytestmark = pytest.mark.integration

SPACE = {"x": {"type": "float", "low": -3, "high": 3}}


def test_each_trial_logs_into_the_one_run_the_driver_fills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is the current folder's
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    keys = {"space": SPACE, "metric": "score", "workers": 2, "directory": tmp_path,
            "progress": False, "mlflow": "sqlite:///mlflow.db", "retry_crashes": True}  # fmt: skip

    trialq.optimize(trials.logs_into_its_mlflow_run, n_trials=3, **keys)
    study = trialq.optimize(trials.logs_into_its_mlflow_run, n_trials=4, **keys)

    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert [t.number for t in complete] == [0, 1, 2, 3]
    assert study.trials[0].user_attrs["attempts"] == 2, "trial 0's first attempt was killed"
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(study.study_name).experiment_id
    runs = client.search_runs([experiment])
    (parent,) = (run for run in runs if run.data.tags["trialq.role"] == "study")
    children = [run for run in runs if run != parent]
    numbers = sorted(int(run.data.tags["trialq.trial_number"]) for run in children)
    assert numbers == [0, 1, 2, 3], "exactly one nested run per trial"
    for run in children:
        trial = study.trials[int(run.data.tags["trialq.trial_number"])]
        run_id = run.info.run_id
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.info.status == "FINISHED"
        # the trial's own logging ...
        losses = client.get_metric_history(run_id, "user_loss")
        attempts = list(range(1, trial.user_attrs["attempts"] + 1))
        assert sorted(m.step for m in losses) == attempts
        assert losses[0].value == pytest.approx(trial.params["x"] ** 2)
        notes = sorted(artifact.path for artifact in client.list_artifacts(run_id))
        assert notes == [f"attempt-{n}.txt" for n in attempts]
        # ... beside the driver's record of the trial
        assert run.data.params == {"x": str(trial.params["x"])}
        assert run.data.metrics["score"] == pytest.approx(trial.value)
        assert run.data.tags["trialq.outcome"] == "ok"
        history = client.get_metric_history(run_id, "reports/score")
        assert {m.step: pytest.approx(m.value) for m in history} == trial.intermediate_values
    artifacts = Path(client.get_experiment(experiment).artifact_location.removeprefix("file://"))
    assert artifacts.is_relative_to(tmp_path)
