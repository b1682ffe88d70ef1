"""`--local`'s workers' logs (issue 28, items 1 and 2): a line per trial at the default
level, each run's logs in a folder of its own (the newest few kept), named at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TESTS_DIR

from trialq.local import LOCAL_RUNS_KEPT, local_logs
from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


def test_each_local_run_keeps_its_workers_logs_with_a_line_per_trial(
    write_spec: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(
        f"""
        [study]
        name = "logged"
        n_trials = 2
        sampler = "grid"
        [trial]
        entrypoint = "{TESTS_DIR / "trials.py"}:raises"
        [space.x]
        type = "categorical"
        choices = ["bad", "good"]
        """
    )
    submit_study(spec, Settings(), None, None, 1, show_progress=False)
    submit_study(spec, Settings(), None, 3, 1, show_progress=False)

    runs = sorted((spec.parent / "logged-logs").iterdir())
    assert len(runs) == 2, "the second run kept the first run's logs"
    first = (runs[0] / "worker0.log").read_text()
    assert "trial finished outcome=error" in first and "trial finished outcome=ok" in first
    # The local Redis has no password: no line invents one (kombu's `redis://:**@`).
    assert ":**@" not in first and "ready: broker redis://127.0.0.1:" in first
    assert "Connected to redis://127.0.0.1:" in first
    assert f"workers' logs: {runs[1]}" in capsys.readouterr().err


def test_only_the_newest_runs_logs_are_kept(
    tmp_path: Path, write_spec: Callable[..., Path]
) -> None:
    from trialq.spec import load_spec

    spec = load_spec(
        write_spec(
            '[study]\nname = "s"\nn_trials = 1\n[trial]\nentrypoint = "json:dumps"\n[space.x]\ntype = "int"\nlow = 0\nhigh = 1\n'
        )
    )
    for _ in range(LOCAL_RUNS_KEPT + 3):
        local_logs(spec).mkdir(parents=True)

    assert len(list((tmp_path / "s-logs").iterdir())) == LOCAL_RUNS_KEPT
