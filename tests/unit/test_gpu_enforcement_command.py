"""The device command for GPU budgets (benchmarks/gpu_enforcement.sh and its Python driver),
rehearsed where there is no GPU: it prepares, then stops in one line at the GPU, exit 3,
having measured and written nothing. Its sections need a GPU; they run on a lent machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_enforcement

ROOT = Path(__file__).resolve().parents[2]


def test_the_driver_without_a_gpu_says_so_in_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gpu_enforcement, "nvml_or_none", lambda: "NVML: no device")
    out = tmp_path / "out"
    assert gpu_enforcement.main(["bypass", "--out", str(out)]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == gpu_enforcement.NO_GPU.format(why="NVML: no device") + "\n"
    assert not out.exists()


@pytest.mark.skipif(gpu_enforcement.nvml_or_none() is None, reason="a GPU is here")
def test_the_command_rehearsed_here_stops_at_the_gpu_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    run = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_enforcement.sh")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 3, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_enforcement: no NVIDIA GPU here (")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_record_keeps_every_section_that_ended(tmp_path: Path) -> None:
    gpu_enforcement.record(tmp_path, "facts", {"name": "MADE-UP, not a GPU's"})
    gpu_enforcement.record(tmp_path, "bypass", {"enforced": True})
    whole = json.loads((tmp_path / "enforcement.json").read_text())
    assert set(whole["sections"]) == {"facts", "bypass"} and "date" in whole


def test_its_resnet_50_stand_in_is_resnet_50_where_torchvision_is_missing() -> None:
    torch = pytest.importorskip("torch")
    from benchmarks.gpu_enforcement_trials import _bottleneck_resnet50

    model = _bottleneck_resnet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's count
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


def test_its_harness_runs_a_worker_and_ends_only_what_it_started(
    redis_url: str, tmp_path: Path
) -> None:
    """Rehearsed on FAKE GPUs (tests/fake_nvml.py), a fake trial in place of its CUDA ones:
    the worker starts, the trial's result comes back, and the worker and every process it
    started are gone after, by their ids."""
    import fake_nvml

    fake_nvml.describe(tmp_path / "nvml", 1, 16 * 2**30)
    records = tmp_path / "records"
    records.mkdir()
    env = {
        "TRIALQ_NVML_MODULE": "fake_nvml", "FAKE_NVML_DIR": str(tmp_path / "nvml"),
        "TRIALQ_ALLOWED_MODULES": "fake_gpu_trials", "TRIALQ_PRELOAD": "none",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    }  # fmt: skip
    with gpu_enforcement.worker(redis_url, tmp_path, "rehearse", per_gpu=2, env=env) as queue:
        assert _started_with(env["FAKE_NVML_DIR"])  # the worker, seen by its environment
        params = {"log": str(records), "hold_mb": 100, "sleep_s": 0.2}
        (result,) = gpu_enforcement.run(
            redis_url, queue, [("records_its_gpu", params)], "auto", module="fake_gpu_trials"
        )
    assert result["outcome"] == "ok", result
    assert _started_with(env["FAKE_NVML_DIR"]) == []  # worker, pool and trials: all gone


def _started_with(nvml_dir: str) -> list[int]:
    """The live processes whose environment names this fake GPU (what the harness started)."""
    import psutil

    found = []
    for process in psutil.process_iter(["environ", "status"]):
        environ = process.info["environ"] or {}
        if environ.get("FAKE_NVML_DIR") == nvml_dir and process.info["status"] != "zombie":
            found.append(process.pid)
    return found
