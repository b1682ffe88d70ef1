"""`[study] ask_processes` end to end through `submit_study`, real workers, the real Redis and
PostgreSQL: the study ends at its budget, every trial told once with its params from the
spec's space, and no ask process outlives the run (issue 42)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path

import optuna
import psutil
import pytest

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


def test_a_study_with_ask_processes_ends_at_its_budget_each_trial_told_once(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., object],
    redis_url: str,
    postgres_url: str,
) -> None:
    start_workers(2)
    name = f"asked-apart-{uuid.uuid4().hex[:8]}"
    spec = write_spec(
        f"""
        [study]
        name = "{name}"
        direction = "maximize"
        metric = "score"
        n_trials = 40
        max_in_flight = 4
        sampler = "tpe"
        ask_processes = 2
        storage = "{postgres_url}"
        [trial]
        entrypoint = "trials:quadratic"
        timeout_s = 60
        [space.x]
        type = "float"
        low = -5
        high = 5
        """
    )

    try:
        summary = submit_study(spec, Settings(broker_url=redis_url), None, None, None, False)
    finally:
        with contextlib.suppress(KeyError):  # a run that failed before making the study
            optuna.delete_study(study_name=name, storage=postgres_url)

    trials = summary["trials"]
    assert [t["number"] for t in trials] == list(range(40))
    assert {t["state"] for t in trials} == {"COMPLETE"}
    assert len({t["user_attrs"]["task_id"] for t in trials}) == 40
    assert all(-5 <= t["params"]["x"] <= 5 for t in trials)
    askers = [
        p
        for p in psutil.Process().children(recursive=True)
        if "trialq.driver.asking.asker" in " ".join(p.cmdline())
    ]
    assert askers == [], "an ask process outlived the run"
