"""Studies built directly in SQLite with the user attrs the driver writes, for fast tests.

The attrs come from a real `recorded_of(result)` (what a record keeps of a result) plus `attempts` and `task_id`, as
`StudyDriver._finish` records them, so status and report read what a real run leaves.
At least one test per feature still runs the real path (tests/integration/test_observe.py).
"""

from __future__ import annotations

import json

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState

from trialq.wire.messages import Outcome, TrialResult
from trialq.wire.record import recorded_of

MIB = 2**20
SPACE = {"x": FloatDistribution(0.0, 10.0), "lr": FloatDistribution(1e-4, 1e-1, log=True)}
_STATE = {Outcome.OK: TrialState.COMPLETE, Outcome.PRUNED: TrialState.PRUNED}


def finished_study(
    storage: str, name: str = "built", outcomes: str = "ok ok pruned error ok oom ok pruned"
) -> optuna.Study:
    """One trial per outcome named, in order; ok trials score x, every trial reports steps."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    for index, outcome in enumerate(Outcome(word) for word in outcomes.split()):
        _tell(study, index, outcome)
    return study


def _tell(study: optuna.Study, index: int, outcome: Outcome) -> None:
    trial = study.ask(SPACE)
    x = trial.params["x"]
    for step in range(2 if outcome is Outcome.PRUNED else 5):
        trial.report(x * (step + 1) / 5, step)
    result = TrialResult(
        study=study.study_name, number=trial.number, attempt=1, outcome=outcome,
        metrics={"score": x} if outcome is Outcome.OK else {},
        worker_pid=1000 + index, worker_host=f"gpu-host-{index % 2}", duration_s=2.0 + index,
        peak_rss_bytes=(300 + 10 * index) * MIB, gpu_peak_bytes=(500 + index) * MIB,
        gpu_memory_used_peak_bytes=(900 + 20 * index) * MIB, gpu_utilization_mean=50.0 + index,
        error=None if outcome in _STATE else f"{outcome.value}: <b>trial {index}</b> failed\ntail",
    )  # fmt: skip
    for key, value in {**recorded_of(result), "attempts": 1, "task_id": f"t{index}"}.items():
        trial.set_user_attr(key, value)
    state = _STATE.get(outcome, TrialState.FAIL)
    study.tell(trial, values=x if state is TrialState.COMPLETE else None, state=state)


def trial_fields(trial: optuna.trial.FrozenTrial) -> str:
    """What Optuna shows of a trial, as text, to compare a copy with a database read: a NaN
    equals no NaN, but its text does."""
    fields = (
        trial.number,
        trial.state,
        trial.values,
        trial.params,
        trial.distributions,
        trial.user_attrs,
        trial.system_attrs,
        trial.intermediate_values,
        trial.datetime_start,
        trial.datetime_complete,
    )
    return json.dumps(fields, sort_keys=True, default=repr)
