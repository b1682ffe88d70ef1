"""`trial.mlflow_run_id`: the trial's nested MLflow run, found or made from the trial process,
so that the user's own `mlflow.log_artifact` lands in the run the driver fills when it tells
the trial (docs/tracking.md).

Looked up by the tags the driver's tracker uses (`tracking/mlflow_runs.py`): every attempt,
and the driver after them, find the same run. MLflow is imported here only when asked, and
its failure (not installed, a server that does not answer) is one warning line in the
trial's log and None, never the trial's.
"""

from __future__ import annotations

import logging

from trialq.tracking.mlflow_runs import ROLE_TAG, experiment_id, find_run, first_use, trial_run
from trialq.trial.soft_limit import SoftLimitPassed
from trialq.wire.messages import MlflowTarget

_log = logging.getLogger("trialq.mlflow")


def mlflow_run_id(
    target: MlflowTarget,
    study: str,
    number: int,
    timeout_errors: tuple[type[BaseException], ...] = (),
) -> str | None:
    """The id of trial `number`'s run in `study`'s experiment, made if absent (under the
    study's run where the driver made it already; the driver adds the parent tag when not).
    MLflow's fluent API is pointed at the study's store, for `mlflow.start_run(run_id=...)`.
    The trial's time limit passing meanwhile (`timeout_errors`, `SoftLimitPassed`) is raised,
    even where MLflow wrapped it, so that the trial ends `timeout` as it would elsewhere."""
    try:
        import mlflow
        from mlflow.tracking import MlflowClient
    except ImportError:
        _log.warning("trial.mlflow_run_id is None: mlflow is not installed in this worker "
                     "(pip install 'trialq[mlflow]')")  # fmt: skip
        return None
    try:
        if target.tracking_uri is not None:
            mlflow.set_tracking_uri(target.tracking_uri)
        uri = mlflow.get_tracking_uri()  # the fluent API's, so the user's calls go where ours do
        with first_use(uri):
            client = MlflowClient(uri)
            experiment = experiment_id(client, target.experiment)
        parent = find_run(client, experiment, study, {ROLE_TAG: "study"})
        return trial_run(client, experiment, study, number, parent)
    except Exception as exc:
        limit = _limit_in(exc, (SoftLimitPassed, *timeout_errors))
        if limit is not None:
            raise limit from None
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        _log.warning("trial.mlflow_run_id is None: MLflow at %s failed: %s",
                     target.tracking_uri or "its default store", reason)  # fmt: skip
        return None


def _limit_in(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The time limit's exception `exc` is or was raised while handling (MLflow's HTTP
    client raises its own exception for whatever interrupted a request)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, kinds):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
