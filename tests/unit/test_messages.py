"""The trial request carries its own time limits, and a request from an older driver, which
sent the hard limit beside it, still reads (a compatible change: the version stays 1); a
result's user attrs cross the wire as the trial set them."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from trialq.wire.entrypoint import Entrypoint
from trialq.wire.messages import MESSAGE_VERSION, TrialRequest, TrialResult
from trialq.wire.outcome import Outcome
from trialq.wire.signing import Seal

BASE: dict[str, object] = {
    "study": "limits",
    "number": 0,
    "attempt": 1,
    "params": {"x": 1.0},
    "entrypoint": Entrypoint("trials", "quadratic"),
    "timeout_s": 60,
}


def _request(**fields: object) -> TrialRequest:
    return TrialRequest.model_validate({**BASE, **fields})


def test_the_hard_limit_travels_in_the_request() -> None:
    request = _request(hard_limit_s=120)
    sent = request.model_dump(mode="json")
    assert sent["hard_limit_s"] == 120 and sent["version"] == MESSAGE_VERSION
    assert TrialRequest.model_validate(sent) == request


def test_a_request_from_an_older_driver_reads_without_a_hard_limit() -> None:
    old = _request().model_dump(mode="json")
    del old["hard_limit_s"]
    assert TrialRequest.model_validate(old).hard_limit_s is None


@pytest.mark.parametrize("hard_limit_s", [60, 30, 0])
def test_a_hard_limit_not_past_the_soft_one_is_refused(hard_limit_s: float) -> None:
    with pytest.raises(ValidationError, match="hard_limit_s"):
        _request(hard_limit_s=hard_limit_s)


def test_params_keep_their_types_through_the_wire() -> None:
    """A categorical's `False` reaches the trial as `False`, not `0.0` (pydantic 2.8's smart
    union chose float for it: the trial saw another value, and what it ran differed from what
    the driver sent)."""
    from trial_requests import trial_request

    from trialq.wire.messages import TrialRequest

    params = {"flag": False, "on": True, "n": 3, "lr": 0.5, "name": "a", "none": None}
    sent = trial_request(study="types", params=params)

    received = TrialRequest.model_validate(sent.model_dump(mode="json"))

    assert received.params == params
    assert [type(v) for v in received.params.values()] == [type(v) for v in params.values()]
    assert received.what_ran() == sent.what_ran()


def _result_with(user_attrs: dict[str, object]) -> TrialResult:
    return TrialResult.here(_request(), Outcome.OK, metrics={"value": 1.0}, user_attrs=user_attrs)


def test_non_finite_user_attrs_cross_the_signed_wire_as_set() -> None:
    """A NaN or infinity a trial sets as a user attr is stored as set (Optuna's storages keep
    it), not as the null pydantic writes for it: the signed JSON on the wire has none."""
    seal = Seal("s3cret")
    attrs = {"val_loss": float("nan"), "peak": float("inf"), "nested": [1.0, float("-inf")]}
    wire = seal.signed("task-1", _result_with(attrs).model_dump_json())

    body = json.loads(wire)
    assert seal.result_refusal("task-1", body) is None
    told = TrialResult.model_validate(body).told_user_attrs()

    assert math.isnan(told["val_loss"]) and told["peak"] == math.inf
    assert told["nested"] == [1.0, -math.inf]
    assert body["user_attrs"]["val_loss"] is None, "what a reader from before the text takes"


def test_finite_user_attrs_travel_without_a_copy() -> None:
    attrs = {"acc": 0.93, "notes": {"tags": ["a"]}}
    body = json.loads(_result_with(attrs).model_dump_json())
    assert body["user_attrs_text"] is None
    assert TrialResult.model_validate(body).told_user_attrs() == attrs


@pytest.mark.parametrize("text", ["not json", "[1, 2]", "NaN"])
def test_user_attrs_text_that_is_no_object_makes_no_result(text: str) -> None:
    """Set aside where the result is read, in one line, never an error where it is told."""
    body = json.loads(_result_with({}).model_dump_json())
    with pytest.raises(ValidationError, match="user_attrs_text is not a JSON object"):
        TrialResult.model_validate({**body, "user_attrs_text": text})
