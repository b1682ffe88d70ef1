"""`python -m benchmarks.gpu`'s plumbing rehearsed without a GPU: real `trialq worker`
processes and an embedded Redis on FAKE GPUs (tests/fake_nvml.py), running the benchmark's
stand-in trial (no device work). What runs is the benchmark's own code: one worker serving
interleaved packings as its studies' `max_in_flight`, each run saved as it ends, and two
workers on one GPU from one shell and from two PID namespaces. No figure here is a GPU's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import fake_nvml
import pytest

from benchmarks import gpu_packing, gpu_sharing
from benchmarks.gpu_cluster import live_in_session
from benchmarks.gpu_plan import Deadline

pytestmark = pytest.mark.integration

TESTS_DIR = Path(__file__).resolve().parent.parent
FAKE_TOTAL = 16 * 2**30


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One fake GPU; the benchmark and its workers read it through TRIALQ_NVML_MODULE."""
    folder = tmp_path / "fake-nvml"
    fake_nvml.describe(folder, 1, FAKE_TOTAL)
    path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
    for name, value in {
        "TRIALQ_NVML_MODULE": "fake_nvml", "FAKE_NVML_DIR": str(folder), "PYTHONPATH": path,
        "TRIALQ_HEARTBEAT_INTERVAL_S": "0.5", "TRIALQ_PRELOAD": "none",
        "TRIALQ_BENCH_PIDFILE": str(tmp_path / "pids"),
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(gpu_packing.MODEL_SPACES, "stand_in", {"learning_rate": (0.1, 1.0)})
    monkeypatch.setitem(gpu_packing.PRELOAD, "stand_in", "none")
    monkeypatch.setattr(gpu_sharing, "SHARED_ENTRY", "stand_in")
    monkeypatch.setattr(gpu_sharing, "TORCH_PRELOADED", {"TRIALQ_PRELOAD": "none"})
    return tmp_path / "pids"


@pytest.mark.usefixtures("fake_gpu")
def test_packings_interleave_on_one_worker_and_each_run_is_saved_as_it_ends() -> None:
    saved: list[dict[str, Any]] = []
    found = gpu_packing.throughput(
        ("stand_in",), 1, Deadline(240.0), lambda part: saved.append(_copy(part)), (1, 2)
    )
    runs = found["stand_in"]["runs"]
    assert [run["per_gpu"] for run in runs] == [1, 2]
    assert all(run["outcomes"] == {"ok": 16} and run["trials"] == 16 for run in runs)
    assert [run["waves"] for run in runs] == [16, 8]
    assert all(run["budget_min_bytes"] and run["peaks_within_budget"] for run in runs)
    assert found["stand_in"]["summary"]["all_ok"] and found["not_run"] == []
    assert [len(part["stand_in"]["runs"]) for part in saved] == [1, 2]


def test_two_workers_share_one_gpu_from_one_shell_and_from_two_pid_namespaces(
    fake_gpu: Path,
) -> None:
    saved: list[dict[str, Any]] = []
    found = gpu_sharing.shared_gpu(4, Deadline(240.0), lambda part: saved.append(_copy(part)))
    assert [sorted(part) for part in saved] == [["same_shell"], ["pid_namespaces", "same_shell"]]
    shell = found["same_shell"]
    assert shell["outcomes"] == {"ok": 4}
    assert [len(lines) for lines in shell["ready_lines"]] == [1, 1], "each worker's own start"
    namespaces = found["pid_namespaces"]
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        assert "not_run" in namespaces
        return
    assert namespaces["wrap"] == list(gpu_sharing.UNSHARE)
    assert namespaces["outcomes"] == {"ok": 4}
    assert [len(lines) for lines in namespaces["ready_lines"]] == [1, 1]
    sessions = [int(line) for line in fake_gpu.read_text().split()]
    assert len(sessions) == 4, "each worker's session id written for the command"
    assert [live_in_session(session) for session in sessions] == [[]] * 4, "a worker left running"


def _copy(part: dict[str, Any]) -> dict[str, Any]:
    import json

    return dict(json.loads(json.dumps(part)))
