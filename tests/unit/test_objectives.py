"""Picking the objective values out of a trial's metrics."""

from __future__ import annotations

import math

import pytest

from trialq.driver.objective import objective_of, objective_values
from trialq.errors import SpecError
from trialq.wire.messages import TrialResult
from trialq.wire.record import recorded_of


def test_a_bare_number_is_the_objective_whatever_the_metric_name() -> None:
    assert objective_values({"value": 0.5}, None) == [0.5]
    assert objective_values({"value": 0.5}, ("val_accuracy",)) == [0.5]


def test_the_named_metrics_are_picked_in_order() -> None:
    metrics = {"acc": 0.9, "cost": 2.0, "loss": 0.1}
    assert objective_values(metrics, ("cost", "acc")) == [2.0, 0.9]


def test_a_lone_metric_needs_no_name() -> None:
    assert objective_values({"acc": 0.9}, None) == [0.9]


def test_several_metrics_and_no_name_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"set study\.metric"):
        objective_values({"a": 1.0, "b": 2.0}, None)


def test_a_missing_metric_names_what_was_returned() -> None:
    with pytest.raises(KeyError, match="metric acc not returned"):
        objective_values({"loss": 0.1}, ("acc",))


def test_a_result_with_fields_from_a_newer_worker_still_reads() -> None:
    from trialq.wire.messages import TrialResult

    raw = {"study": "s", "number": 1, "attempt": 1, "outcome": "ok", "new_field": 3}
    assert TrialResult.model_validate(raw).outcome == "ok"


def _ok(metrics: dict[str, float]) -> TrialResult:
    return TrialResult(study="s", number=0, attempt=1, outcome="ok", metrics=metrics)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_objective_fails_the_trial_as_not_finite(bad: float) -> None:
    result, values = objective_of(_ok({"loss": bad, "acc": 0.5}), ("loss",))

    assert values is None
    assert result.outcome == "not_finite"
    assert result.error == f"objective is not finite: loss = {bad}"


def test_a_non_finite_extra_metric_leaves_the_objective_and_is_kept_as_text() -> None:
    result, values = objective_of(_ok({"loss": 0.25, "grad_norm": math.inf}), ("loss",))

    assert values == [0.25] and result.outcome == "ok"
    assert recorded_of(result)["metrics"] == {"loss": 0.25, "grad_norm": "inf"}


def test_a_non_finite_bare_number_is_named_by_the_specs_metric() -> None:
    result, _ = objective_of(_ok({"value": math.nan}), ("val_accuracy",))

    assert result.error == "objective is not finite: val_accuracy = nan"


def test_a_non_finite_metric_crosses_the_wire_and_reads_back() -> None:
    sent = _ok({"loss": math.nan, "acc": -math.inf})
    back = TrialResult.model_validate_json(sent.model_dump_json())

    assert math.isnan(back.metrics["loss"]) and back.metrics["acc"] == -math.inf
