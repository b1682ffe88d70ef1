"""`[study] ask_ahead` end to end through `submit_study`, real workers and the real Redis: the
study ends with exactly its budget, every trial told once, nothing left WAITING or RUNNING;
and a run stopped by its goal gives its asks back, which the next run sends first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


def _spec(write_spec: Callable[..., Path], goal: str = "") -> Path:
    return write_spec(
        f"""
        [study]
        name = "ahead"
        direction = "maximize"
        metric = "score"
        n_trials = 12
        max_in_flight = 2
        ask_ahead = 2
        sampler_args = {{ seed = 3 }}
        {goal}
        [trial]
        entrypoint = "trials:quadratic"
        timeout_s = 60
        [space.x]
        type = "float"
        low = -5
        high = 5
        """
    )


def _run(spec: Path, redis_url: str) -> dict:
    settings = Settings(broker_url=redis_url)
    return submit_study(spec, settings, None, None, None, show_progress=False)


def test_a_study_asking_ahead_ends_at_its_budget_each_trial_told_once(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)

    summary = _run(_spec(write_spec), redis_url)

    trials = summary["trials"]
    assert [t["number"] for t in trials] == list(range(12))
    assert {t["state"] for t in trials} == {"COMPLETE"}
    assert len({t["user_attrs"]["task_id"] for t in trials}) == 12
    assert all(t["user_attrs"]["attempts"] == 1 for t in trials)


def test_asks_a_goal_left_unsent_are_the_next_run_s_first_trials(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    """The goal (any score above -1e9) ends the run at its first results; what was asked
    ahead waits in the study, and the run without a goal sends exactly those first."""
    start_workers(2)
    first = _run(_spec(write_spec, goal="goal = -1e9"), redis_url)
    waiting = {t["number"]: t["params"] for t in first["trials"] if t["state"] == "WAITING"}
    assert waiting, f"nothing was asked ahead: {[t['state'] for t in first['trials']]}"
    assert "RUNNING" not in {t["state"] for t in first["trials"]}

    second = _run(_spec(write_spec), redis_url)

    trials = second["trials"]
    assert [t["number"] for t in trials] == list(range(12))
    assert {t["state"] for t in trials} == {"COMPLETE"}
    assert {n: trials[n]["params"] for n in waiting} == waiting
