"""The worker's start probe (`trialq.gpu.nvml_probe`) against a FAKE NVML answering as each
driver family does (`tests/fake_nvml.py`): a real probe process, a fake's figures."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import fake_nvml
import pytest

from trialq.gpu.attribution import ProcessView
from trialq.gpu.inventory import Nvml
from trialq.gpu.nvml_probe import probe

TESTS_DIR = Path(__file__).resolve().parent.parent


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    fake_nvml.describe(tmp_path, 1, 16 * 2**30)
    monkeypatch.setenv("FAKE_NVML_DIR", str(tmp_path))
    path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)  # the probe process imports the fake too
    yield tmp_path


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ({}, ProcessView.PIDS),
        ({"pids": "translated"}, ProcessView.PIDS),
        ({"pids": "host"}, ProcessView.OTHER_PIDS),
        ({"pids": "translated", "memory": "zero"}, ProcessView.PIDS_WITHOUT_MEMORY),
        ({"memory": "unavailable"}, ProcessView.PIDS_WITHOUT_MEMORY),
        ({"processes": "error"}, ProcessView.NO_PROCESSES),
    ],
)
def test_the_probe_finds_the_family_out(
    folder: Path, family: dict[str, str], expected: ProcessView
) -> None:
    fake_nvml.behave_as(folder, **family)

    with Nvml.open("fake_nvml") as nvml:
        found = probe(nvml, "0", "fake_nvml")
        left = nvml.processes("0") if expected is not ProcessView.NO_PROCESSES else {}

    assert found.view is expected, found
    assert left == {}  # the probe process is gone, and what it held with it


def test_a_probe_that_cannot_open_a_context_leaves_the_view_unknown(folder: Path) -> None:
    with Nvml.open("fake_nvml") as nvml:
        found = probe(nvml, "0", "no_such_nvml_binding")

    assert found.view is ProcessView.UNKNOWN
    assert found.detail is not None and "could not open a CUDA context" in found.detail
