"""GPU flags on a machine without a GPU (issue 39, item 5): the slot flags without `--gpus`
are refused, and `--gpus` where NVML finds no driver says so; both exit 2 with one line.

No worker is started: Celery's run is replaced by a stub that fails the test if reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from trialq import cli
from trialq._celery import launch
from trialq.errors import UsageError
from trialq.gpu.inventory import Nvml


@pytest.fixture(autouse=True)
def _no_worker_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> int:
        raise AssertionError("a worker was about to start; the command should have refused")

    monkeypatch.setattr(launch, "run_celery", refuse)
    monkeypatch.delenv("TRIALQ_GPUS", raising=False)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--trials-per-gpu", "2"], "--trials-per-gpu"),
        (["--gpu-memory-mb", "900"], "--gpu-memory-mb"),
        (["--gpus-per-trial", "2", "--trials-per-gpu", "1"], "--trials-per-gpu, --gpus-per-trial"),
    ],
)
def test_gpu_slot_flags_without_gpus_are_refused(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.trialq_main(["worker", "--preload", "none", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"error: trialq worker: {named} cut --gpus into slots; give --gpus (or TRIALQ_GPUS) too"
    )


def test_gpu_slot_flags_with_gpus_from_the_environment_are_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRIALQ_GPUS", "0")
    args, _ = cli._trialq_parser().parse_known_args(["worker", "--trials-per-gpu", "2"])
    assert cli._worker_settings(args).trials_per_gpu == 2


def test_gpus_without_a_driver_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """FAKE NVML (tests/fake_nvml.py) with no GPUs described: its init fails as pynvml's does
    where the binding is installed and no driver is loaded."""
    # Preloading is not what is tested: its fork guard would refuse first where another test
    # of this pytest process ran a framework's op.
    monkeypatch.setattr(launch, "preload_for", lambda *_args: None)
    monkeypatch.setenv("TRIALQ_NVML_MODULE", "fake_nvml")
    monkeypatch.setenv("FAKE_NVML_DIR", str(tmp_path))
    assert cli.trialq_main(["worker", "--gpus", "all", "--preload", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --gpus all: no NVIDIA driver or GPU found (NVML: fake NVML: no gpus.json)"
    ]


def test_a_missing_binding_is_said_apart_from_a_missing_driver() -> None:
    reason = Nvml.absence("trialq_no_such_nvml_binding")
    assert reason.startswith("no NVML binding (No module named 'trialq_no_such_nvml_binding'")
    assert "nvidia-ml-py" in reason and "driver" not in reason
    assert UsageError.exit_code == 2
