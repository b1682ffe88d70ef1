"""Signed results and reports (`trialq.wire.signing`): what verifies and what is set aside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from trial_requests import trial_request

from trialq.settings import Settings
from trialq.wire.messages import Outcome, TrialResult
from trialq.wire.signing import (
    MISMATCH,
    TASK_MISMATCH,
    TASK_UNSIGNED,
    UNSIGNED,
    Seal,
    stored_result_refusal,
)
from trialq.worker.result_store import ResultStore

SECRET = "a-deployment-secret-0123456789"


def _signed(task_id: str = "task-1", seal: Seal | None = None) -> str:
    result = TrialResult.of(trial_request(), Outcome.OK).model_copy(update={"metrics": {"v": 1.5}})
    store = ResultStore(lambda: None, 60, 10_000, seal or Seal(SECRET))  # type: ignore[arg-type,return-value]
    return store.bounded_json(task_id, result)


def test_a_signed_result_verifies_for_its_task_only() -> None:
    seal = Seal(SECRET)
    text = _signed()
    assert stored_result_refusal(seal, "task-1", text) is None
    assert stored_result_refusal(seal, "task-1", json.loads(text)) is None  # as Celery decodes
    assert stored_result_refusal(seal, "task-2", text) == MISMATCH  # replayed onto another
    assert stored_result_refusal(Seal("another-secret-0123456789"), "task-1", text) == MISMATCH


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda body: body | {"metrics": {"v": -1e9}}, MISMATCH),
        (lambda body: body | {"number": body["number"] + 1}, MISMATCH),
        (lambda body: body | {"worker_host": "attacker"}, MISMATCH),
        (lambda body: {k: v for k, v in body.items() if k != "signature"}, UNSIGNED),
        (lambda body: body | {"signature": 7}, MISMATCH),
    ],
)
def test_a_changed_result_is_set_aside(change: object, why: str) -> None:
    body = change(json.loads(_signed()))  # type: ignore[operator]
    assert stored_result_refusal(Seal(SECRET), "task-1", json.dumps(body)) == why


def test_what_is_no_json_object_is_set_aside_with_or_without_a_secret() -> None:
    for seal in (Seal(SECRET), None):
        assert stored_result_refusal(seal, "t", b"\xff not json") == "not a JSON object"
        assert stored_result_refusal(seal, "t", "[1, 2]") == "not a JSON object"
    assert stored_result_refusal(Seal(SECRET), "t", '{"a": NaN, "signature": "x"}') == MISMATCH


def test_without_a_secret_results_are_stored_unsigned() -> None:
    result = TrialResult.of(trial_request(), Outcome.OK)
    text = ResultStore(lambda: None, 60, 10_000).bounded_json("t", result)  # type: ignore[arg-type,return-value]
    assert "signature" not in json.loads(text)


def test_a_report_verifies_for_its_attempt_step_and_value_only() -> None:
    seal = Seal(SECRET)
    signature = seal.report_signature(("s", 1, 1), 3, "0.5")
    assert seal.report_refusal(("s", 1, 1), 3, "0.5", signature) is None
    assert seal.report_refusal(("s", 1, 2), 3, "0.5", signature) == MISMATCH
    assert seal.report_refusal(("s", 1, 1), 3, "-9.0", signature) == MISMATCH
    assert seal.report_refusal(("s", 1, 1), 3, "0.5", None) == UNSIGNED


def test_the_secret_comes_from_its_file_and_must_be_long_enough(tmp_path: Path) -> None:
    secret = tmp_path / "result-secret"
    secret.write_text(SECRET + "\n")
    settings = Settings(result_secret_file=secret)
    assert settings.seal is not None and SECRET not in repr(settings)
    secret.write_text("short")
    with pytest.raises(ValidationError, match="at least 16"):
        Settings(result_secret_file=secret)
    with pytest.raises(ValidationError, match="cannot read"):
        Settings(result_secret_file=tmp_path / "missing")


def _sent(task_id: str = "task-1", **changes: object) -> dict[str, object]:
    payload = trial_request(params={"x": 0.5}).model_dump(mode="json", exclude={"signature"})
    return Seal(SECRET).sign_task(task_id, {**payload, **changes})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("params", {"x": 0.75}),
        ("entrypoint", "trials:fails"),
        ("study", "another"),
        ("number", 8),
        ("attempt", 2),
        ("timeout_s", 1e6),
    ],
)
def test_a_task_verifies_only_as_its_driver_signed_it(field: str, value: object) -> None:
    seal = Seal(SECRET)
    sent = _sent()
    assert seal.task_refusal("task-1", sent) is None
    assert seal.task_refusal("task-1", {**sent, field: value}) == TASK_MISMATCH


def test_a_task_is_refused_unsigned_on_another_task_or_under_another_secret() -> None:
    seal = Seal(SECRET)
    unsigned = {k: v for k, v in _sent().items() if k != "signature"}
    assert seal.task_refusal("task-1", unsigned) == TASK_UNSIGNED
    assert seal.task_refusal("task-2", _sent("task-1")) == TASK_MISMATCH  # an old one replayed
    assert Seal("another-secret-0123456789").task_refusal("task-1", _sent()) == TASK_MISMATCH


def test_one_payload_signed_as_one_kind_does_not_verify_as_another() -> None:
    seal = Seal(SECRET)
    signature = seal.sign("task", ["t", {"a": 1}])
    assert seal.refusal("task", ["t", {"a": 1}], signature) is None
    assert seal.refusal("function", ["t", {"a": 1}], signature) == MISMATCH
    assert seal.refusal("task", ["t", {"a": 2}], signature) == MISMATCH
