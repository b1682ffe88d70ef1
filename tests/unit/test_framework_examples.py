"""The PyTorch and JAX examples and the Lightning callback, each run end to end as a trial on
CPU through the runner, with a stand-in report channel (the driver's side of it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trial_requests import trial_request

from trialq.gpu.device import FakeDevice
from trialq.trial.runner import run_trial
from trialq.wire.messages import Outcome, TrialResult
from trialq.wire.record import recorded_of

pytestmark = pytest.mark.slow  # each trains a real model on the CPU


class StandInChannel:
    """A driver in miniature: keeps every report, asks for pruning after `prune_after` of
    them and for a stop after `stop_after` (None: never)."""

    def __init__(self, prune_after: int | None = None, stop_after: int | None = None) -> None:
        self.reports: list[tuple[int, float]] = []
        self.prune_after, self.stop_after = prune_after, stop_after

    def report(self, address: object, step: int, value: float) -> None:
        self.reports.append((step, value))

    def prune_requested(self, address: object) -> bool:
        return self.prune_after is not None and len(self.reports) >= self.prune_after

    def stop_requested(self, address: object) -> bool:
        return self.stop_after is not None and len(self.reports) >= self.stop_after


def _run(
    entrypoint: str, channel: StandInChannel, tmp_path: Path | None = None, attempt: int = 1,
    **params: Any,
) -> TrialResult:  # fmt: skip
    request = trial_request(
        entrypoint=entrypoint, params=params, attempt=attempt,
        checkpoint_key=None if tmp_path is None else "s/0-abcdef",
    )  # fmt: skip
    return run_trial(
        request, channel=channel, device=FakeDevice(),  # type: ignore[arg-type]
        allowed_modules=("trialq.examples", "framework_trials"), checkpoint_root=tmp_path,
    )  # fmt: skip


EXAMPLES = ["trialq.examples.torch_digits:train", "trialq.examples.jax_digits:train"]
FRAMEWORK = {EXAMPLES[0]: "torch", EXAMPLES[1]: "jax"}
LEARNING_RATE = {EXAMPLES[0]: 3e-3, EXAMPLES[1]: 0.05}


@pytest.mark.parametrize("entrypoint", EXAMPLES)
def test_an_example_learns_and_reports_every_epoch(entrypoint: str) -> None:
    pytest.importorskip(FRAMEWORK[entrypoint])
    pytest.importorskip("sklearn")
    channel = StandInChannel()
    result = _run(
        entrypoint, channel, epochs=3, batch_size=32, learning_rate=LEARNING_RATE[entrypoint]
    )
    assert result.outcome is Outcome.OK, result.error
    assert result.metrics["val_accuracy"] > 0.5, "ten classes: chance is 0.1"
    assert [step for step, _ in channel.reports] == [0, 1, 2]
    assert result.fitted_batch_size is None and result.metrics["batch_size"] == 32


@pytest.mark.parametrize("entrypoint", EXAMPLES)
def test_an_example_fits_its_batch_size_and_the_trial_records_it(entrypoint: str) -> None:
    pytest.importorskip(FRAMEWORK[entrypoint])
    result = _run(entrypoint, StandInChannel(), epochs=1, fit_batch_size=True)
    assert result.outcome is Outcome.OK, result.error
    # On a CPU every size fits: the search ends at its maximum, the training set's size.
    assert result.fitted_batch_size == 1437 == result.metrics["batch_size"]
    assert recorded_of(result)["fitted_batch_size"] == 1437


@pytest.mark.parametrize("entrypoint", EXAMPLES)
def test_an_example_honours_should_prune(entrypoint: str) -> None:
    pytest.importorskip(FRAMEWORK[entrypoint])
    channel = StandInChannel(prune_after=2)
    result = _run(entrypoint, channel, epochs=5)
    assert result.outcome is Outcome.PRUNED and result.last_step == 1
    assert len(channel.reports) == 2


def test_the_torch_example_saves_on_a_stop_and_the_next_attempt_resumes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    stopped = _run(EXAMPLES[0], StandInChannel(stop_after=1), tmp_path, epochs=3)
    assert stopped.outcome is Outcome.PREEMPTED and stopped.last_step == 0
    channel = StandInChannel()
    resumed = _run(EXAMPLES[0], channel, tmp_path, attempt=2, epochs=3)
    assert resumed.outcome is Outcome.OK and [s for s, _ in channel.reports] == [1, 2]


def test_the_lightning_callback_reports_every_validation() -> None:
    pytest.importorskip("lightning")
    channel = StandInChannel()
    result = _run("framework_trials:lightning_fit", channel, epochs=3)
    assert result.outcome is Outcome.OK, result.error
    assert [step for step, _ in channel.reports] == [0, 1, 2]  # no sanity check's value
    assert channel.reports[-1][1] == pytest.approx(result.metrics["val_loss"])


def test_the_lightning_callback_prunes_when_the_driver_asks() -> None:
    pytest.importorskip("lightning")
    channel = StandInChannel(prune_after=2)
    result = _run("framework_trials:lightning_fit", channel, epochs=5)
    assert result.outcome is Outcome.PRUNED and result.last_step == 1


def test_the_lightning_callback_saves_on_a_stop_and_the_next_attempt_resumes(
    tmp_path: Path,
) -> None:
    pytest.importorskip("lightning")
    stopped = _run(
        "framework_trials:lightning_fit", StandInChannel(stop_after=1), tmp_path, epochs=3
    )
    assert stopped.outcome is Outcome.PREEMPTED and stopped.last_step == 0
    channel = StandInChannel()
    resumed = _run("framework_trials:lightning_fit", channel, tmp_path, attempt=2, epochs=3)
    assert resumed.outcome is Outcome.OK and [s for s, _ in channel.reports] == [1, 2]
