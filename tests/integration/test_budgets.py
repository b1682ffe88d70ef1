"""Study budgets with real workers (issue 30): each stop reason ends the run with what is
left kept, a re-run goes on from there, and `[[enqueue]]` params are sent exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

from trialq.cli import submit_study_main, trialq_main
from trialq.errors import FailingTrials
from trialq.settings import Settings
from trialq.submit import submit_study
from trialq.wire.messages import LAST_RUN_ATTR

pytestmark = pytest.mark.integration


def _run(spec: Path, redis_url: str, n_trials: int | None = None, **budget: Any) -> dict[str, Any]:
    settings = Settings(broker_url=redis_url)
    return submit_study(spec, settings, None, n_trials, None, False, budget_overrides=budget)


def _study(spec: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{spec.parent / name}.db")


def _sleeps_spec(
    write_spec: Callable[..., Path], name: str, study_keys: str, sleep_s: float
) -> Path:
    return write_spec(
        f"""
        [study]
        name = "{name}"
        n_trials = 12
        max_in_flight = 2
        {study_keys}
        [trial]
        entrypoint = "trials:sleeps"
        [space.sleep_s]
        type = "categorical"
        choices = [{sleep_s}]
        """,
        name=f"{name}.toml",
    )


def test_a_wall_time_stop_sends_no_new_trial_and_a_rerun_goes_on_with_what_is_left(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = _sleeps_spec(write_spec, "wall", "max_wall_s = 2.0", 1.0)

    first = _run(spec, redis_url)

    assert first["stopped_by"] == "max_wall_s"
    done = len(first["trials"])
    assert 2 <= done < 12 and all(t["state"] == "COMPLETE" for t in first["trials"])
    assert first["budgets"]["max_wall_s"]["used"] >= 2.0
    second = _run(spec, redis_url, max_wall_s=120)
    assert second["stopped_by"] == "n_trials"
    assert [t["number"] for t in second["trials"]] == list(range(12))
    assert {t["state"] for t in second["trials"]} == {"COMPLETE"}


def test_a_hard_wall_stops_the_trials_in_flight_and_the_next_run_sends_them_again(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = _sleeps_spec(write_spec, "hard", "max_wall_s = 1.0\nmax_wall_hard = true", 3.0)

    first = _run(spec, redis_url, n_trials=4)

    assert first["stopped_by"] == "max_wall_s"
    left = [t for t in _study(spec, "hard").trials if t.state.name == "RUNNING"]
    assert len(left) == 2, "the two trials in flight were stopped, and left for a later run"
    second = _run(spec, redis_url, n_trials=4, max_wall_s=300)
    trials = _study(spec, "hard").trials
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    assert all(t.user_attrs["retries"] == 0 for t in trials)
    assert second["stopped_by"] == "n_trials"


def test_trials_of_cpu_only_workers_use_no_gpu_hours(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = _sleeps_spec(write_spec, "gpuh", f"max_gpu_hours = {0.5 / 3600}", 0.6)

    first = _run(spec, redis_url, n_trials=4)

    assert first["stopped_by"] == "n_trials", "CPU-only trials were counted as GPU-hours"
    assert first["budgets"]["max_gpu_hours"]["used"] == 0
    assert all(t["user_attrs"]["gpus"] == 1 for t in first["trials"])


def test_a_goal_reached_ends_the_run_and_enqueued_params_are_sent_once(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "goal"
        direction = "maximize"
        metric = "score"
        n_trials = 30
        max_in_flight = 1
        goal = -0.01
        [trial]
        entrypoint = "trials:quadratic"
        [space.x]
        type = "float"
        low = -5
        high = 5
        [[enqueue]]
        x = -4.0
        [[enqueue]]
        x = 2.0
        """,
        name="goal.toml",
    )

    first = _run(spec, redis_url)
    second = _run(spec, redis_url, goal=1.0, n_trials=4)

    assert first["stopped_by"] == "goal" and first["best_value"] == 0.0
    assert [t["params"]["x"] for t in first["trials"]] == [-4.0, 2.0]
    xs = [t["params"]["x"] for t in second["trials"]]
    assert xs[:2] == [-4.0, 2.0] and len(xs) == 4
    assert -4.0 not in xs[2:] and 2.0 not in xs[2:], "an enqueued set was sent again"
    assert _study(spec, "goal").user_attrs[LAST_RUN_ATTR]["stopped_by"] == "n_trials"


def test_max_failed_trials_stops_the_run_as_failing_with_the_rest_kept(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "failing"
        n_trials = 30
        max_in_flight = 1
        max_failures_in_a_row = 0
        max_failed_trials = 3
        [trial]
        entrypoint = "trials:fails_the_same_way"
        [space.x]
        type = "float"
        low = 0
        high = 1
        """,
        name="failing.toml",
    )
    with pytest.raises(FailingTrials, match=r"3 trials failed \(max_failed_trials = 3\)"):
        _run(spec, redis_url)

    assert [t.state.name for t in _study(spec, "failing").trials] == ["FAIL"] * 3


def test_a_failing_stop_prints_the_json_summary_records_the_last_run_and_stops_in_flight(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "failing-json"
        n_trials = 30
        max_in_flight = 2
        max_failures_in_a_row = 0
        max_failed_trials = 2
        [trial]
        entrypoint = "trials:sleeps_or_fails"
        [space.how]
        type = "categorical"
        choices = ["slow", "fail"]
        [[enqueue]]
        how = "slow"
        [[enqueue]]
        how = "fail"
        [[enqueue]]
        how = "fail"
        [[enqueue]]
        how = "fail"
        """,
        name="failing-json.toml",
    )
    started = time.monotonic()

    code = submit_study_main([str(spec), "--json", "--no-progress", "--broker", redis_url])

    assert code == 5
    assert time.monotonic() - started < 45, "the run waited for the slow trial in flight"
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["stopped_by"] == "max_failed_trials" and summary["n_failed"] == 2
    assert summary["left_in_flight"] == 1
    assert err.count("2 trials failed (max_failed_trials = 2)") == 1, err
    study = _study(spec, "failing-json")
    assert study.user_attrs[LAST_RUN_ATTR]["stopped_by"] == "max_failed_trials"
    assert [t.params["how"] for t in study.trials if t.state.name == "RUNNING"] == ["slow"]
    assert trialq_main(["status", str(spec), "--broker", redis_url]) == 0
    assert "last run: stopped by max_failed_trials" in capsys.readouterr().out


def test_status_of_the_spec_finds_a_study_run_with_storage_elsewhere(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start_workers(1)
    spec = _sleeps_spec(write_spec, "elsewhere", "", 0.1)
    elsewhere = f"sqlite:///{tmp_path / 'other' / 'studies.db'}"
    (tmp_path / "other").mkdir()

    submit_study(spec, Settings(broker_url=redis_url), elsewhere, 2, None, False)

    assert not (spec.parent / "elsewhere.db").exists()
    assert trialq_main(["status", str(spec), "--broker", redis_url]) == 0
    assert "study elsewhere" in capsys.readouterr().out
