"""The core path end to end: driver -> Celery on the real Redis -> real worker processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


def _run(spec: Path, redis_url: str, n_trials: int | None = None) -> dict:
    settings = Settings(broker_url=redis_url)
    return submit_study(spec, settings, None, n_trials, None, show_progress=False)


def _quadratic_spec(write_spec: Callable[..., Path], n_trials: int = 10) -> Path:
    return write_spec(
        f"""
        [study]
        name = "quad"
        direction = "maximize"
        metric = "score"
        n_trials = {n_trials}
        max_in_flight = 2
        sampler_args = {{ seed = 1 }}
        [trial]
        entrypoint = "trials:quadratic"
        timeout_s = 60
        [space.x]
        type = "float"
        low = -5
        high = 5
        """
    )


def test_ten_trials_through_two_workers_each_in_its_own_process(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    summary = _run(_quadratic_spec(write_spec), redis_url)

    trials = summary["trials"]
    assert len(trials) == 10
    assert {t["state"] for t in trials} == {"COMPLETE"}
    pids = [t["user_attrs"]["worker_pid"] for t in trials]
    assert len(set(pids)) == 10, f"a process ran more than one trial: {pids}"
    # The pid the trial saw itself is the one the runner recorded.
    assert all(t["user_attrs"]["metrics"]["pid"] == t["user_attrs"]["worker_pid"] for t in trials)
    best = max(trials, key=lambda t: t["values"][0])
    assert summary["best_value"] == best["values"][0]
    assert summary["best_params"] == best["params"]
    for trial in trials:
        assert trial["values"][0] == pytest.approx(-((trial["params"]["x"] - 2.0) ** 2))
        attrs = trial["user_attrs"]
        assert attrs["outcome"] == "ok" and attrs["attempts"] == 1 and attrs["task_id"]
        assert attrs["duration_s"] >= 0 and attrs["peak_rss_bytes"] > 0
        assert attrs["gpu_peak_bytes"] is None


def test_resume_reaches_n_trials_without_duplicates(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = _quadratic_spec(write_spec, n_trials=10)
    first = _run(spec, redis_url, n_trials=5)
    assert first["n_complete"] == 5

    second = _run(spec, redis_url)

    numbers = [t["number"] for t in second["trials"]]
    assert numbers == list(range(10))
    assert second["n_complete"] == 10
    task_ids = [t["user_attrs"]["task_id"] for t in second["trials"]]
    assert len(set(task_ids)) == 10


def test_a_raising_trial_fails_with_its_message_and_the_study_goes_on(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "raising"
        n_trials = 6
        sampler = "grid"
        [trial]
        entrypoint = "trials:raises"
        [space.x]
        type = "categorical"
        choices = ["bad", "good", "fine"]
        """
    )
    summary = _run(spec, redis_url)

    failed = [t for t in summary["trials"] if t["state"] == "FAIL"]
    complete = [t for t in summary["trials"] if t["state"] == "COMPLETE"]
    assert failed and complete
    assert len(failed) + len(complete) == 6
    for trial in failed:
        assert trial["params"]["x"] == "bad"
        assert trial["user_attrs"]["outcome"] == "error"
        assert "ValueError: refusing x=bad on purpose" in trial["user_attrs"]["error"]
    assert all(t["params"]["x"] != "bad" for t in complete)


def test_results_arriving_out_of_order_are_told_to_their_own_trials(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(3)
    spec = write_spec(
        """
        [study]
        name = "out-of-order"
        metric = "echo"
        n_trials = 6
        max_in_flight = 3
        sampler = "grid"
        [trial]
        entrypoint = "trials:sleeps_then_echoes"
        [space.sleep_s]
        type = "categorical"
        choices = [2.0, 0.1, 1.0, 0.5, 1.5, 0.2]
        """
    )
    summary = _run(spec, redis_url)

    trials = summary["trials"]
    assert all(t["state"] == "COMPLETE" for t in trials)
    for trial in trials:
        assert trial["values"][0] == pytest.approx(trial["params"]["sleep_s"] * 100)
    storage = f"sqlite:///{spec.parent / 'out-of-order.db'}"
    study = optuna.load_study(study_name="out-of-order", storage=storage)
    finish_order = [t.number for t in sorted(study.trials, key=lambda t: t.datetime_complete)]
    assert finish_order != sorted(finish_order), "results should not have arrived in order"


def test_one_argument_entrypoint_returning_a_number(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(1)
    spec = write_spec(
        """
        [study]
        name = "one-arg"
        direction = "minimize"
        n_trials = 2
        [trial]
        entrypoint = "trials:one_argument"
        [space.x]
        type = "int"
        low = 1
        high = 3
        """
    )
    summary = _run(spec, redis_url)
    for trial in summary["trials"]:
        assert trial["values"] == [trial["params"]["x"] * 10]


def test_several_metrics_and_no_metric_in_the_spec_stops_with_exit_2(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trialq.cli import submit_study_main

    start_workers(1)
    spec = write_spec(
        """
        [study]
        name = "no-metric"
        n_trials = 3
        max_in_flight = 1
        [trial]
        entrypoint = "trials:several_metrics"
        [space.x]
        type = "int"
        low = 0
        high = 3
        """
    )
    code = submit_study_main([str(spec), "--broker", redis_url, "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].endswith("but the spec names none: set study.metric"), err
    study = optuna.load_study(
        study_name="no-metric", storage=f"sqlite:///{spec.parent / 'no-metric.db'}"
    )
    (trial,) = study.trials
    assert trial.state.name == "FAIL" and "set study.metric" in trial.user_attrs["error"]
