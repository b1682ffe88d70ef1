"""Picking the objective values out of a trial's metrics."""

from __future__ import annotations

import pytest

from trialq.driver.loop import objective_values
from trialq.errors import SpecError


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
