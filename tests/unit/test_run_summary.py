"""The run's summary is typed (`RunSummary`), and its JSON is what `submit-study --json`
printed before it was: the study's keys, then the run's `stopped_by`, `budgets` and
`left_in_flight`; a study with nothing left to do prints the study's keys alone."""

from __future__ import annotations

import json

import optuna

from trialq.driver.budget import Budget
from trialq.driver.ledger import Ledger
from trialq.submit import RunSummary
from trialq.views.summary import study_summary

STUDY_KEYS = ["study", "n_complete", "n_pruned", "n_failed", "best_value", "best_params", "trials"]


def _study() -> optuna.Study:
    study = optuna.create_study(study_name="summed")
    attrs = {"outcome": "ok", "duration_s": 1.5}
    study.add_trial(optuna.trial.create_trial(params={"x": 0.5}, distributions={
        "x": optuna.distributions.FloatDistribution(0, 1)}, value=0.25, user_attrs=attrs))  # fmt: skip
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    return study


def test_a_runs_summary_is_the_studys_then_how_the_run_ended() -> None:
    study = _study()
    ledger = Ledger(study, lambda: 0.0, Budget(4, max_failed_trials=3))
    ledger.open()

    summary = RunSummary(study_summary(study), ledger.last_run("interrupted"), left_in_flight=2)
    printed = json.loads(json.dumps(summary.to_json(), default=str))

    assert list(printed) == [*STUDY_KEYS, "stopped_by", "budgets", "left_in_flight"]
    assert (printed["n_complete"], printed["n_failed"], printed["best_value"]) == (1, 1, 0.25)
    assert printed["best_params"] == {"x": 0.5}
    assert printed["trials"][0] == {
        "number": 0, "state": "COMPLETE", "values": [0.25], "params": {"x": 0.5},
        "user_attrs": {"outcome": "ok", "duration_s": 1.5},
    }  # fmt: skip
    assert printed["stopped_by"] == "interrupted" and printed["left_in_flight"] == 2
    assert printed["budgets"] == {
        "n_trials": {"limit": 4, "used": 2},
        "max_failed_trials": {"limit": 3, "used": 1},
    }


def test_a_study_with_nothing_left_to_do_prints_the_studys_keys_alone() -> None:
    summary = RunSummary(study_summary(_study()))

    assert list(summary.to_json()) == STUDY_KEYS
