"""The per-trial runner in this process: outcomes, metrics and the allow-list."""

from __future__ import annotations

from pathlib import Path

import pytest
from trial_requests import trial_request

from trialq.gpu.device import FakeDevice
from trialq.trial.runner import numeric_metrics, run_trial
from trialq.wire.entrypoint import Entrypoint
from trialq.wire.failures import classify
from trialq.wire.messages import Outcome, TrialRequest


def _request(entrypoint: str, **params: object) -> TrialRequest:
    return trial_request(number=3, params=params, entrypoint=entrypoint, timeout_s=10)


def test_ok_trial_records_metrics_process_and_device() -> None:
    device = FakeDevice(peak=1234)
    result = run_trial(
        _request("trials:quadratic", x=3.0),
        channel=None,
        device=device,
        allowed_modules=("trials",),
    )
    assert result.outcome is Outcome.OK
    assert result.metrics["score"] == -1.0
    assert result.gpu_peak_bytes == 1234 and device.prepared
    assert result.worker_pid == result.metrics["pid"]
    assert result.peak_rss_bytes and result.peak_rss_bytes > 0


def test_raising_trial_is_error_with_type_message_and_traceback_tail() -> None:
    result = run_trial(
        _request("trials:raises", x="bad"),
        channel=None,
        device=FakeDevice(),
        allowed_modules=("trials",),
    )
    assert result.outcome is Outcome.ERROR
    assert result.error is not None
    assert result.error.startswith("ValueError: refusing x=bad on purpose")
    assert "trials.py" in result.error and "raise ValueError" in result.error


def test_module_outside_the_allow_list_is_refused_before_import() -> None:
    result = run_trial(
        _request("trials:quadratic", x=1.0),
        channel=None,
        device=FakeDevice(),
        allowed_modules=("trialq.examples",),
    )
    assert result.outcome is Outcome.REFUSED  # the worker's, not the trial's failure
    assert "not in this worker's allowed modules" in (result.error or "")


def test_an_entrypoint_that_does_not_import_on_this_worker_is_refused() -> None:
    result = run_trial(
        _request("trials_missing_here:train", x=1.0),
        channel=None,
        device=FakeDevice(),
        allowed_modules=("trials_missing_here",),
    )
    assert result.outcome is Outcome.REFUSED
    assert "trials_missing_here:train does not import on this worker" in (result.error or "")


def test_a_trial_that_honours_should_prune_is_pruned_at_its_last_step() -> None:
    pruned = run_trial(
        _request("trials:reports_curve", x=1.0),
        channel=_AlwaysPrune(), device=FakeDevice(), allowed_modules=("trials",),  # type: ignore[arg-type]
    )  # fmt: skip
    assert pruned.outcome is Outcome.PRUNED and pruned.last_step == 0


def test_optunas_own_trial_pruned_is_a_pruning_not_an_error() -> None:
    """Code written for Optuna prunes with `optuna.TrialPruned`: taken as trialq's own."""
    pruned = run_trial(
        _request("trials:prunes_as_optuna_code_does", x=1.0),
        channel=None, device=FakeDevice(), allowed_modules=("trials",),
    )  # fmt: skip
    assert pruned.outcome is Outcome.PRUNED and pruned.error is None
    assert pruned.last_step == 1


class _AlwaysPrune:
    """A stand-in channel whose driver always says prune (the real one needs Redis)."""

    def report(self, address: object, step: int, value: float) -> None:
        pass

    def prune_requested(self, address: object) -> bool:
        return True


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (MemoryError(), Outcome.OOM),
        (RuntimeError("OOM when allocating tensor with shape[1024]"), Outcome.OOM),
        (RuntimeError("CUDNN_STATUS_ALLOC_FAILED"), Outcome.OOM),
        (RuntimeError("CUDA_ERROR_OUT_OF_MEMORY: out of memory"), Outcome.OOM),
        (type("ResourceExhaustedError", (Exception,), {})("x"), Outcome.OOM),
        (ValueError("shapes do not match"), Outcome.ERROR),
    ],
)
def test_failure_classification(exc: BaseException, outcome: Outcome) -> None:
    assert classify(exc) is outcome


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (0.5, {"value": 0.5}),
        (3, {"value": 3.0}),
        ({"a": 1, "b": "text", "c": 2.5}, {"a": 1.0, "c": 2.5}),
    ],
)
def test_numeric_metrics(returned: object, expected: dict[str, float]) -> None:
    assert numeric_metrics(returned) == expected


@pytest.mark.parametrize("returned", [None, True, "0.9", {"a": "x"}])
def test_non_numeric_returns_are_errors(returned: object) -> None:
    with pytest.raises(TypeError):
        numeric_metrics(returned)


def test_file_entrypoints_are_allowed_by_folder(tmp_path: Path) -> None:
    ref = Entrypoint.parse(f"{tmp_path}/t.py:train")
    assert ref.is_allowed((f"{tmp_path}/",))
    assert not ref.is_allowed(("t",))
    assert Entrypoint.parse("pkg.mod:f").is_allowed(("pkg",))
    assert not Entrypoint.parse("pkgx.mod:f").is_allowed(("pkg",))
