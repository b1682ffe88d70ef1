"""`submit-study --local` takes the worker's GPU flags for the one worker that owns the GPUs,
and a GPU setting its worker refuses is exit 2 (a misconfiguration), not 3 (issue 39, item 5)."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from trialq.cli import submit_study_main

pytestmark = pytest.mark.integration

SPEC = """
[study]
name = "gpu-flags"
n_trials = 2
[trial]
entrypoint = "trials:quadratic"
[space.x]
type = "float"
low = 0
high = 1
"""


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--gpus", "all"], "--gpus configure --local's worker"),
        (["--local", "--trials-per-gpu", "2"], "give --gpus too"),
        (["--local", "--gpus", "all", "--workers", "2"], "leave out --workers"),
    ],
)
def test_gpu_flags_outside_local_or_without_gpus_are_one_line_and_exit_2(
    write_spec: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    said: str,
) -> None:
    spec = write_spec(SPEC)
    assert submit_study_main([str(spec), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine has GPUs")
def test_trialq_gpus_where_no_gpu_is_exit_2_naming_the_cause(
    write_spec: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = write_spec(SPEC)
    monkeypatch.setenv("TRIALQ_GPUS", "all")
    assert submit_study_main([str(spec), "--no-progress", "--local"]) == 2
    err = capsys.readouterr().err
    # with nvidia-ml-py installed the cause is the missing driver or GPU; without it, the package
    cause = "no NVIDIA" if importlib.util.find_spec("pynvml") is not None else "no NVML binding"
    assert f"error: local worker refused its settings: error: --gpus all: {cause}" in err, err
