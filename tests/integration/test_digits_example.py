"""The shipped example: a real Keras CNN on the digits images, through real workers, on CPU."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration

EXAMPLE_SPEC = Path(__file__).parents[2] / "examples" / "digits" / "study.toml"
LIGHT_TRIALS = "".join(
    f"""
[[enqueue]]
learning_rate = {rate}
filters = 8
dense_units = 64
batch_size = 32
optimizer = "adam"
mixed_precision = false
"""
    for rate in (3e-3, 1e-3, 5e-3)
)
"""Three sets of the example's params, each a few seconds an epoch on a CPU."""


def test_three_digits_trials_finish_above_chance(
    tmp_path: Path, start_workers: Callable[..., object], redis_url: str
) -> None:
    pytest.importorskip("tensorflow")
    pytest.importorskip("sklearn")
    spec = tmp_path / "study.toml"
    shutil.copy(EXAMPLE_SPEC, spec)
    with spec.open("a") as file:  # light sets: the sampler's own may pick float16 on a CPU,
        file.write(LIGHT_TRIALS)  # minutes a trial (the example is for a GPU)
    start_workers(2)

    summary = submit_study(spec, Settings(broker_url=redis_url), None, 3, None, show_progress=False)

    finished = [t for t in summary["trials"] if t["state"] in {"COMPLETE", "PRUNED"}]
    assert len(summary["trials"]) == 3 and len(finished) == 3, summary["trials"]
    assert summary["n_complete"] >= 1
    assert summary["best_value"] > 0.5, "ten classes: chance is 0.1"
    for trial in summary["trials"]:
        attrs = trial["user_attrs"]
        assert attrs["gpu_peak_bytes"] is None  # no GPU on this machine
        if trial["state"] == "COMPLETE":
            assert set(attrs["metrics"]) == {"val_accuracy", "val_loss", "accuracy"}
            assert trial["values"] == [attrs["metrics"]["val_accuracy"]]
