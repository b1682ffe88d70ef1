"""MLflow: one parent run per study, a nested run per trial with its params, final metrics,
reports by step (`reports/<objective>`), outcome, attempts, worker host and GPU peaks.

Runs are found by their tags before one is made (`trialq.study`, `trialq.trial_number`;
`tracking/mlflow_runs.py`): a trial recorded again (a re-sent attempt told once, a driver
restarted on the study) finds its run, one the trial process made for `trial.mlflow_run_id`
is filled, and one recorded whole is left as it is. Written through an `MlflowClient` of its
own, never MLflow's global active run, which the user's own code may be using.
"""

from __future__ import annotations

import time
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from trialq.tracking.base import StudyInfo, ToldTrial
from trialq.tracking.config import MlflowTracking
from trialq.tracking.mlflow_runs import (
    PARENT_TAG,
    RECORDED_TAG,
    ROLE_TAG,
    RUN_NAME_TAG,
    STUDY_TAG,
    experiment_id,
    find_run,
    first_use,
    tracking_uri,
    trial_run,
    trial_tags,
)

_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "KILLED", "FAIL": "FAILED"}
BEST_TRIAL_TAG = "trialq.best_trial"
"""The study run's tag naming the trial of its best value (`best/<objective>`)."""


class MlflowTracker:
    """Runs in an MLflow experiment (docs/tracking.md)."""

    name = "mlflow"

    def __init__(self, config: MlflowTracking) -> None:
        self._config = config
        self._study: StudyInfo | None = None
        self._client: MlflowClient | None = None
        self.experiment_id = ""
        self.parent_run_id = ""

    def start(self, study: StudyInfo) -> None:
        self._study = study
        uri = tracking_uri(self._config, study.spec_folder) or mlflow.get_tracking_uri()
        with first_use(uri):
            self._client = MlflowClient(tracking_uri=uri)
            self.experiment_id = experiment_id(self._client, self._config.experiment or study.name)
        parent = self._find({ROLE_TAG: "study"})
        if parent is None:
            tags = {STUDY_TAG: study.name, ROLE_TAG: "study", RUN_NAME_TAG: study.name}
            self.parent_run_id = self._client.create_run(self.experiment_id, tags=tags).info.run_id
        else:
            self.parent_run_id = parent
            self._client.update_run(parent, status="RUNNING")

    def record(self, trial: ToldTrial) -> None:
        assert self._client is not None and self._study is not None
        found = self._find(trial_tags(trial.number))
        run_tags = self._client.get_run(found).data.tags if found is not None else {}
        if run_tags.get(RECORDED_TAG):
            return  # recorded whole before: never twice
        run_id = found or self._create(trial)
        params, metrics, tags = _contents(trial, self._study)
        if run_tags and not run_tags.get(PARENT_TAG):  # the trial made it before the study's
            tags.append(RunTag(PARENT_TAG, self.parent_run_id))
        self._client.log_batch(run_id, metrics=metrics, params=params, tags=tags)
        self._client.set_tag(run_id, RECORDED_TAG, "true")
        end = int(trial.ended.timestamp() * 1000) if trial.ended else None
        self._client.set_terminated(run_id, status=_STATUS.get(trial.state, "FINISHED"),
                                    end_time=end)  # fmt: skip
        self._note_best(trial)

    def close(self) -> None:
        if self._client is not None and self.parent_run_id:
            self._client.set_terminated(self.parent_run_id, status="FINISHED")

    def _note_best(self, trial: ToldTrial) -> None:
        """The study's run holds the best value so far (`best/<objective>`) and its trial
        (`trialq.best_trial`), for one objective; each better one is logged at step 0, so
        MLflow's latest value, the last logged, is the best whatever order trials end in."""
        assert self._client is not None and self._study is not None
        study = self._study
        if trial.state != "COMPLETE" or not trial.values or len(study.directions) != 1:
            return
        key, value = f"best/{study.metric_names[0]}", trial.values[0]
        held = self._client.get_run(self.parent_run_id).data.metrics.get(key)
        if held is None or (value > held if study.directions[0] == "maximize" else value < held):
            self._client.log_metric(self.parent_run_id, key, value, step=0)
            self._client.set_tag(self.parent_run_id, BEST_TRIAL_TAG, str(trial.number))

    def _create(self, trial: ToldTrial) -> str:
        assert self._client is not None and self._study is not None
        start = int(trial.started.timestamp() * 1000) if trial.started else None
        return trial_run(self._client, self.experiment_id, self._study.name, trial.number,
                         self.parent_run_id, start_time=start)  # fmt: skip

    def _find(self, tags: dict[str, str]) -> str | None:
        """The run of this study with these tags, if one was made."""
        assert self._client is not None and self._study is not None
        return find_run(self._client, self.experiment_id, self._study.name, tags)


def _contents(trial: ToldTrial, study: StudyInfo) -> tuple[list[Param], list[Metric], list[RunTag]]:
    """A trial's params, metrics (reports by step, then its final values) and tags."""
    now = int(time.time() * 1000)
    params = [Param(name, str(value)) for name, value in trial.params.items()]
    objective = study.metric_names[0]
    metrics = [Metric(f"reports/{objective}", value, now, step)
               for step, value in sorted(trial.intermediate.items())]  # fmt: skip
    last = max(trial.intermediate, default=0)
    finals: dict[str, Any] = {**trial.final_metrics, **trial.objective_values(study)}
    attrs = trial.summary_attrs
    finals |= {f"trialq/{k}": v for k, v in attrs.items() if _is_number(v)}
    metrics += [Metric(key, float(value), now, last) for key, value in finals.items()]
    tags = [RunTag(f"trialq.{k}", str(v)[:5000]) for k, v in attrs.items() if not _is_number(v)]
    return params, metrics, tags


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def tracker(config: MlflowTracking) -> MlflowTracker:
    """The registry's entry (`trialq.tracking.registry`)."""
    return MlflowTracker(config)
