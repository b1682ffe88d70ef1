"""A name longer than the storage's column (PostgreSQL refuses it when first written, as the
first trial's params) is refused at load as one line, exit 2, with no study made; a name
that fits exactly runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from bad_inputs import spec_text

from trialq.cli import submit_study_main


def _space_named(name: str, study: str) -> str:
    return spec_text(
        study=f'name = "{study}"\nn_trials = 1\nmetric = "a"',
        trial='entrypoint = "trials:several_metrics"',
        space=f'[space.{name}]\ntype = "float"\nlow = 0\nhigh = 1',
    )


def test_a_space_name_past_the_column_is_one_line_exit_2_and_no_study(
    write_spec: Callable[..., Path],
    redis_url: str,
    postgres_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = write_spec(_space_named("x" * 513, "too-long-a-name"))

    code = submit_study_main([str(spec), "--broker", redis_url, "--storage", postgres_url,
                              "--no-progress"])  # fmt: skip

    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "a param name of 513 characters; the storage holds at most 512" in err
    names = [s.study_name for s in optuna.get_all_study_summaries(postgres_url)]
    assert "too-long-a-name" not in names


def test_a_space_name_as_long_as_the_column_is_written(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    postgres_url: str,
) -> None:
    start_workers(1)
    name = "just-fits"
    spec = write_spec(_space_named("y" * 512, name))
    try:
        code = submit_study_main([str(spec), "--broker", redis_url, "--storage", postgres_url,
                                  "--no-progress"])  # fmt: skip
        assert code == 0
        trial = optuna.load_study(study_name=name, storage=postgres_url).trials[0]
        assert list(trial.params) == ["y" * 512]
    finally:
        optuna.delete_study(study_name=name, storage=postgres_url)
