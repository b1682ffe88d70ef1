"""What submit-study tells its user: why trials failed (as they fail and at the end), where
the study lives, whether a re-run resumes or has nothing to do, and a changed spec refused
before anything is sent. Real workers, the real Redis, SQLite beside the spec."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from trialq.cli import submit_study_main
from trialq.local import LocalCluster

pytestmark = pytest.mark.integration

SPEC = """
[study]
name = "told"
direction = "{direction}"
n_trials = {n_trials}
max_in_flight = 1
sampler = "grid"
pruner = "none"
[trial]
entrypoint = "trials:raises"
timeout_s = 60
[space.x]
type = "categorical"
choices = {choices}
"""


def _submit(spec: Path, broker: str, *extra: str) -> int:
    return submit_study_main([str(spec), "--broker", broker, "--no-progress", *extra])


def test_failed_trials_are_told_as_they_fail_and_at_the_end(
    write_spec: Callable[..., Path],
    redis_url: str,
    start_workers: Callable[..., LocalCluster],
    capsys: pytest.CaptureFixture[str],
) -> None:
    start_workers(1)
    spec = write_spec(SPEC.format(direction="maximize", n_trials=2, choices='["bad"]'))
    assert _submit(spec, redis_url) == 1  # done, none complete
    err = capsys.readouterr().err
    line = "#{} error: ValueError: refusing x=bad on purpose"
    assert err.count(line.format(0)) == 2 and err.count(line.format(1)) == 2, err  # live, end
    assert "study told: 0 complete, 0 pruned, 2 failed; none complete" in err
    assert f"study 'told' in sqlite:///{spec.parent / 'told.db'}" in err


def test_a_finished_study_says_so_and_a_resumed_one_says_where_it_stands(
    write_spec: Callable[..., Path],
    redis_url: str,
    start_workers: Callable[..., LocalCluster],
    capsys: pytest.CaptureFixture[str],
) -> None:
    start_workers(1)
    spec = write_spec(SPEC.format(direction="maximize", n_trials=2, choices="[1.0]"))
    assert _submit(spec, redis_url) == 0
    assert "resuming" not in capsys.readouterr().err
    assert _submit(spec, redis_url) == 0
    assert "already complete (2/2 trials finished)" in capsys.readouterr().err
    assert _submit(spec, redis_url, "--n-trials", "3") == 0
    err = capsys.readouterr().err
    assert "resuming: 2 done, 0 unfinished, 1 to go" in err
    assert "best value 1.0 with {'x': 1.0}" in err


def test_a_changed_direction_is_refused_before_anything_is_sent(
    write_spec: Callable[..., Path], redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(SPEC.format(direction="maximize", n_trials=2, choices="[1.0]"))
    storage = f"sqlite:///{spec.parent / 'told.db'}"
    optuna.create_study(storage=storage, study_name="told", direction="maximize")
    spec.write_text(spec.read_text().replace('"maximize"', '"minimize"'))
    assert _submit(spec, redis_url) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "study.direction: the study 'told' was made with maximize, the spec says minimize" in err
    assert optuna.load_study(study_name="told", storage=storage).trials == []
