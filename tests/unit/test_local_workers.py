"""`--local`'s workers are configured from typed values: the GPUs its one worker owns
(`LocalGpus`) reach it as the settings a `trialq worker` reads, and the preload it gets is
decided from this process's settings, not its environment read by name."""

from __future__ import annotations

import pytest

from trialq.local import LocalGpus
from trialq.settings import Settings


def test_the_local_gpus_reach_the_worker_as_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = LocalGpus("0,1", trials_per_gpu=2, gpus_per_trial=2, gpu_memory_mb=4096)
    for name, value in gpus.environment().items():
        monkeypatch.setenv(name, value)

    read = Settings()

    assert (read.gpus, read.trials_per_gpu, read.gpus_per_trial, read.gpu_memory_mb) == (
        "0,1", 2, 2, 4096,
    )  # fmt: skip


def test_flags_not_given_leave_the_workers_defaults() -> None:
    assert LocalGpus("all").environment() == {"TRIALQ_GPUS": "all"}
