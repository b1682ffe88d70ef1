"""Pruning across the queue, the Keras callback, OOM-aware search and several objectives,
with real workers on the real Redis."""

from __future__ import annotations

import datetime
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import psutil
import pytest
from waiting import wait_until

from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


def _run(spec: Path, redis_url: str, result_secret: str | None = None) -> dict[str, Any]:
    settings = (  # the environment's secret (the workers', tests/conftest.py) unless given
        Settings(broker_url=redis_url)
        if result_secret is None
        else Settings(broker_url=redis_url, result_secret=result_secret)
    )
    return submit_study(spec, settings, None, None, None, False)


def _enqueue(spec: Path, name: str, direction: str, *params: dict[str, Any]) -> optuna.Study:
    """Pre-create the study with trials in a known order (Optuna's enqueue_trial)."""
    storage = f"sqlite:///{spec.parent / (name + '.db')}"
    study = optuna.create_study(study_name=name, storage=storage, direction=direction)
    for p in params:
        study.enqueue_trial(p)
    return study


def _process_gone(pid: int, told_at: datetime.datetime | None = None) -> bool:
    """Whether the process is gone; a live one created after its trial was told is another
    process that got the pid again (pids wrap at 32768 on a busy machine)."""
    try:
        process = psutil.Process(pid)
        if told_at is not None and process.create_time() > told_at.timestamp():
            return True
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


PRUNING_SPEC = """
    [study]
    name = "{name}"
    direction = "maximize"
    n_trials = {n}
    max_in_flight = 1
    pruner = "median"
    pruner_args = {{ n_startup_trials = 2, n_warmup_steps = 1 }}
    [trial]
    entrypoint = "trials:{entrypoint}"
    prune_grace_s = {grace}
    [space.x]
    type = "float"
    low = 0
    high = 1
    """


def test_median_pruner_stops_worse_curves_early_and_their_processes_exit(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    cluster = start_workers(2)
    spec = write_spec(PRUNING_SPEC.format(name="prune", n=6, entrypoint="reports_curve", grace=30))
    _enqueue(spec, "prune", "maximize", *({"x": x} for x in (1.0, 0.9, 0.1, 0.99, 0.05, 0.2)))

    # With the workers' secret: signed reports feed the pruner, signed results are told.
    summary = _run(spec, redis_url, cluster.result_secret)

    study = optuna.load_study(study_name="prune", storage=f"sqlite:///{spec.parent / 'prune.db'}")
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert {t.params["x"] for t in pruned} >= {0.1, 0.05}, [
        (t.params, t.state) for t in study.trials
    ]
    assert all(t.params["x"] < 0.5 for t in pruned)
    for trial in pruned:
        assert max(trial.intermediate_values) < 9, "pruned before its last step"
        assert trial.user_attrs["outcome"] == "pruned"
    # Told as their processes return: they exit within moments, later on a loaded machine.
    gone = [(t.user_attrs["worker_pid"], t.datetime_complete) for t in pruned]
    wait_until(lambda: all(_process_gone(*each) for each in gone), 10, "the pruned processes to exit")
    assert summary["n_pruned"] == len(pruned)


def test_a_trial_that_ignores_should_prune_is_stopped_from_outside(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    start_workers(1)
    spec = write_spec(
        PRUNING_SPEC.format(name="deaf", n=4, entrypoint="ignores_should_prune", grace=1)
    )
    study = _enqueue(spec, "deaf", "maximize")
    for x in (1.0, 0.9):  # two finished references for the median
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        for step in range(200):
            trial.report(x * (step + 1), step)
        study.tell(trial, x * 200)
    study.enqueue_trial({"x": 0.01})
    study.enqueue_trial({"x": 0.02})

    started = time.monotonic()
    _run(spec, redis_url)
    elapsed = time.monotonic() - started

    stopped = [t for t in optuna.load_study(study_name="deaf", storage=study._storage).trials[2:]]
    assert [t.state.name for t in stopped] == ["PRUNED", "PRUNED"]
    for trial in stopped:
        assert "stopped from outside" in trial.user_attrs["error"]
        assert max(trial.intermediate_values) < 100, "it would have reported 200 steps"
    assert elapsed < 2 * 20, "each uncooperative trial would have run 20 s"


def test_the_keras_callback_prunes_a_real_fit(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    pytest.importorskip("keras")
    start_workers(1)
    spec = write_spec(
        """
        [study]
        name = "keras"
        direction = "maximize"
        n_trials = 3
        max_in_flight = 1
        pruner = "median"
        pruner_args = { n_startup_trials = 2, n_warmup_steps = 2 }
        [trial]
        entrypoint = "trials:keras_fit"
        [space.lr]
        type = "float"
        low = 0
        high = 1
        """
    )
    _enqueue(spec, "keras", "maximize", {"lr": 0.5}, {"lr": 0.4}, {"lr": 0.0})

    summary = _run(spec, redis_url)

    states = [t["state"] for t in summary["trials"]]
    assert states == ["COMPLETE", "COMPLETE", "PRUNED"], summary["trials"]
    study = optuna.load_study(study_name="keras", storage=f"sqlite:///{spec.parent / 'keras.db'}")
    assert max(study.trials[2].intermediate_values) < 14, "the fit stopped before epoch 15"


def test_reports_of_a_retried_attempt_replace_the_earlier_attempts(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    start_workers(
        1, extra_env={"TRIALQ_HEARTBEAT_TTL_S": "3", "TRIALQ_HEARTBEAT_INTERVAL_S": "0.5"}
    )
    spec = write_spec(
        """
        [study]
        name = "retried"
        n_trials = 1
        pruner = "none"
        [trial]
        entrypoint = "trials:dies_then_reports_again"
        max_retries = 1
        retry_crashes = true
        [space.x]
        type = "int"
        low = 0
        high = 1
        """
    )
    _run(spec, redis_url)
    study = optuna.load_study(
        study_name="retried", storage=f"sqlite:///{spec.parent / 'retried.db'}"
    )
    (trial,) = study.trials
    assert trial.user_attrs["attempts"] == 2 and trial.state.name == "COMPLETE"
    assert trial.intermediate_values == dict.fromkeys(range(10), 1.0)


def _oom_share_in_second_half(write_spec: Callable[..., Path], redis_url: str, on: bool) -> float:
    name = f"oom-{'on' if on else 'off'}"
    spec = write_spec(
        f"""
        [study]
        name = "{name}"
        direction = "maximize"
        n_trials = 40
        max_in_flight = 1
        sampler = "tpe"
        sampler_args = {{ seed = 0, n_startup_trials = 10 }}
        pruner = "none"
        oom_as_constraint = {"true" if on else "false"}
        [trial]
        entrypoint = "trials:oom_above"
        [space.size]
        type = "float"
        low = 0
        high = 1
        """,
        name=f"{name}.toml",
    )
    summary = _run(spec, redis_url)
    second_half = summary["trials"][20:]
    return sum(t["user_attrs"]["outcome"] == "oom" for t in second_half) / len(second_half)


def test_oom_as_constraint_steers_tpe_away_from_what_does_not_fit(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., LocalCluster],
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start_workers(2)
    without = _oom_share_in_second_half(write_spec, redis_url, on=False)
    with_constraint = _oom_share_in_second_half(write_spec, redis_url, on=True)
    with capsys.disabled():
        print(
            f"\nOOM share, trials 20-39: without {without:.0%}, with oom_as_constraint {with_constraint:.0%}"
        )
    assert with_constraint < without


def test_nsga2_sees_oom_trials_as_infeasible_and_they_count_as_failures(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "pareto-oom"
        directions = ["maximize", "minimize"]
        metrics = ["accuracy", "cost"]
        n_trials = 12
        max_in_flight = 2
        sampler = "nsga2"
        sampler_args = { seed = 0, population_size = 4 }
        [trial]
        entrypoint = "trials:oom_above_area"
        [space.width]
        type = "float"
        low = 0
        high = 1
        [space.depth]
        type = "float"
        low = 0
        high = 1
        """
    )
    summary = _run(spec, redis_url)
    study = optuna.load_study(
        study_name="pareto-oom", storage=f"sqlite:///{spec.parent / 'pareto-oom.db'}"
    )
    oom = [t for t in study.trials if t.user_attrs["outcome"] == "oom"]
    fits = [t for t in study.trials if t.user_attrs["outcome"] == "ok"]
    assert oom and len(oom) + len(fits) == 12

    # NSGA-II reads only COMPLETE trials: told so, infeasible, with the worst values there are.
    for trial in oom:
        assert trial.state.name == "COMPLETE" and trial.constraints == {"oom": 1.0}
        assert trial.values == [-math.inf, math.inf]
    assert {t.number for t in study.best_trials} <= {t.number for t in fits}
    # They took their place in NSGA-II's generations (a FAIL trial would not).
    assert any(t.system_attrs.get("NSGAIISampler:generation", 0) > 0 for t in study.trials)

    # trialq's own summary counts them as failures and never shows the stand-in values.
    assert (summary["n_complete"], summary["n_failed"]) == (len(fits), len(oom))
    numbers = {t.number for t in oom}
    assert all(t["values"] is None for t in summary["trials"] if t["number"] in numbers)
    json.dumps(summary, allow_nan=False)  # what submit-study --json prints stays valid JSON


def test_two_objectives_go_through_the_same_path(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "pareto"
        directions = ["maximize", "minimize"]
        metrics = ["accuracy", "cost"]
        n_trials = 6
        sampler = "nsga2"
        [trial]
        entrypoint = "trials:two_objectives"
        [space.x]
        type = "float"
        low = 0
        high = 1
        """
    )
    summary = _run(spec, redis_url)
    assert summary["n_complete"] == 6
    for trial in summary["trials"]:
        x = trial["params"]["x"]
        assert trial["values"] == pytest.approx([x, x**2 + 0.1])
    assert summary["best_value"], "the Pareto front is reported"
