"""Metrics and reports as frameworks hand them back (issue 39, item 1): a 0-d tensor of
PyTorch, TensorFlow or JAX and a NumPy scalar are one number; anything else one line naming
the key and what it was. Real torch (CPU build) and NumPy here; JAX and TensorFlow each in a
process of its own, as an op of theirs run in this one would make every later worker of this
pytest process refuse to fork (the preload guard, `trialq.worker.prewarm`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kept_reports import KeptReports
from trial_requests import trial_request

from trialq.gpu.device import FakeDevice
from trialq.trial.context import TrialContext
from trialq.trial.runner import numeric_metrics, run_trial
from trialq.wire.channel import TrialAddress
from trialq.wire.messages import Outcome

torch = pytest.importorskip("torch")


def _in_own_process(code: str) -> list[str]:
    """The lines `code` prints, run by this Python with trialq importable."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        ({"val_accuracy": torch.tensor(0.5)}, {"val_accuracy": 0.5}),
        ({"val_accuracy": np.float32(0.75), "epochs": 3}, {"val_accuracy": 0.75, "epochs": 3.0}),
        (torch.tensor(0.25, requires_grad=True) * 1, {"value": 0.25}),
        (np.array(2.0), {"value": 2.0}),
        (np.int64(7), {"value": 7.0}),
        ({"loss": np.float32(1.5), "note": "text", "flag": np.bool_(True)}, {"loss": 1.5}),
    ],
)
def test_one_number_as_a_framework_hands_it_back(
    returned: object, expected: dict[str, float]
) -> None:
    metrics = numeric_metrics(returned)
    assert metrics == expected
    assert all(type(v) is float for v in metrics.values())


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (
            {"val_accuracy": torch.ones(3)},
            "metric val_accuracy: tensor of shape (3,), not one number",
        ),
        ({"loss": np.zeros((2, 2))}, "metric loss: array of shape (2, 2), not one number"),
        (torch.ones(3), "the trial returned tensor of shape (3,), not one number"),
        ({"z": np.complex64(1j)}, "metric z: array of dtype complex64, not a real number"),
        (torch.tensor(True), "the trial returned tensor of shape (); return a number"),
        (10**400, "the trial returned an int of about 401 digits, past a float's range"),
        ({"score": -(10**400)}, "metric score: an int of about 401 digits, past a float's"),
        ({"score": "abc"}, "the trial returned a mapping with no number in it (score: str)"),
    ],
)
def test_anything_else_is_one_line_naming_the_key(returned: object, message: str) -> None:
    with pytest.raises(TypeError) as caught:
        numeric_metrics(returned)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_jax_arrays_are_one_number_when_0d() -> None:
    pytest.importorskip("jax")
    lines = _in_own_process(
        "import jax.numpy as jnp\n"
        "from trialq.trial.runner import numeric_metrics\n"
        "metrics = numeric_metrics({'loss': jnp.array(0.5), 'lr': jnp.float32(0.25)})\n"
        "print(metrics, {type(v).__name__ for v in metrics.values()})\n"
        "try:\n"
        "    numeric_metrics({'loss': jnp.ones(4)})\n"
        "except TypeError as exc:\n"
        "    print(exc)\n"
    )
    assert lines == [
        "{'loss': 0.5, 'lr': 0.25} {'float'}",
        "metric loss: array of shape (4,), not one number",
    ]


def test_tensorflow_tensors_are_one_number_when_0d() -> None:
    pytest.importorskip("tensorflow")
    lines = _in_own_process(
        "import tensorflow as tf\n"
        "from trialq.trial.runner import numeric_metrics\n"
        "print(numeric_metrics({'acc': tf.constant(0.5)}))\n"
        "try:\n"
        "    numeric_metrics({'acc': tf.constant([0.5, 0.25])})\n"
        "except TypeError as exc:\n"
        "    print(exc)\n"
    )
    assert lines == ["{'acc': 0.5}", "metric acc: tensor of shape (2,), not one number"]


def test_reports_take_0d_tensors_and_refuse_other_shapes_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = KeptReports()
    context = TrialContext(TrialAddress("s", 0, 1), {}, channel)
    context.report(torch.tensor(0.5), 0)
    context.report(np.float32(0.25), 1)
    context.report(np.array(0.125), 2)
    context.report(torch.ones(3), 3)
    assert channel.reports == [(0, 0.5), (1, 0.25), (2, 0.125)]
    assert all(type(v) is float for _, v in channel.reports)
    assert context.reports_refused == 1
    assert "value: tensor of shape (3,), not one number" in caplog.text


def test_a_trial_returning_a_tensor_records_the_float(tmp_path: Path) -> None:
    (tmp_path / "tensor_trial.py").write_text(
        "import torch\n\n"
        "def train(params):\n"
        "    return {'val_accuracy': torch.tensor(0.5), 'epochs': 3}\n"
    )
    result = run_trial(
        trial_request(number=1, params={}, entrypoint=f"{tmp_path}/tensor_trial.py:train"),
        channel=None,
        device=FakeDevice(),
        allowed_modules=(f"{tmp_path}/",),
    )
    assert result.outcome is Outcome.OK, result.error
    assert result.metrics["val_accuracy"] == 0.5 and type(result.metrics["val_accuracy"]) is float


def test_a_metric_no_float_holds_fails_the_trial_in_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "huge_trial.py").write_text("def train(params):\n    return {'score': 10**400}\n")
    result = run_trial(
        trial_request(number=1, params={}, entrypoint=f"{tmp_path}/huge_trial.py:train"),
        channel=None,
        device=FakeDevice(),
        allowed_modules=(f"{tmp_path}/",),
    )
    assert result.outcome is Outcome.ERROR
    assert (
        result.error == "TypeError: metric score: an int of about 401 digits, past a float's range"
    )


def test_converting_imports_no_framework() -> None:
    lines = _in_own_process(
        "import sys, numpy as np\n"
        "from trialq.trial.runner import numeric_metrics\n"
        "assert numeric_metrics({'a': np.float32(0.5)}) == {'a': 0.5}\n"
        "print(sorted(m for m in ('torch', 'jax', 'tensorflow') if m in sys.modules))\n"
    )
    assert lines == ["[]"]


def test_a_trial_returning_a_vector_is_an_error_naming_its_key(tmp_path: Path) -> None:
    (tmp_path / "vector_trial.py").write_text(
        "import torch\n\ndef train(params):\n    return {'val_accuracy': torch.ones(3)}\n"
    )
    result = run_trial(
        trial_request(number=1, params={}, entrypoint=f"{tmp_path}/vector_trial.py:train"),
        channel=None,
        device=FakeDevice(),
        allowed_modules=(f"{tmp_path}/",),
    )
    assert result.outcome is Outcome.ERROR
    first = (result.error or "").splitlines()[0]
    assert first == "TypeError: metric val_accuracy: tensor of shape (3,), not one number"
