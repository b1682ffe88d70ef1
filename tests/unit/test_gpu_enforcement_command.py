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
