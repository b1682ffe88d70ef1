"""Which budget ends a run, as a table: what the run spent -> the stop (or none)."""

from __future__ import annotations

import pytest

from trialq.driver.budget import Budget, BudgetUse, Spent, reached, usage

B = Budget(n_trials=40)

TABLE = [
    ("nothing set: never", B, Spent(wall_s=1e9, gpu_hours=1e9, failed=99, best=1e9), None),
    ("wall time under", Budget(40, max_wall_s=60), Spent(wall_s=59.9), None),
    ("wall time reached", Budget(40, max_wall_s=60), Spent(wall_s=60), "max_wall_s"),
    ("gpu hours under", Budget(40, max_gpu_hours=2), Spent(gpu_hours=1.99), None),
    ("gpu hours reached", Budget(40, max_gpu_hours=2), Spent(gpu_hours=2), "max_gpu_hours"),
    ("goal, maximize, below", Budget(40, goal=0.9), Spent(best=0.89), None),
    ("goal, maximize, reached", Budget(40, goal=0.9), Spent(best=0.9), "goal"),
    ("goal, minimize, above", Budget(40, goal=0.1, maximize=False), Spent(best=0.2), None),
    ("goal, minimize, reached", Budget(40, goal=0.1, maximize=False), Spent(best=0.05), "goal"),
    ("goal, nothing complete yet", Budget(40, goal=0.1), Spent(best=None), None),
    ("failed under", Budget(40, max_failed_trials=3), Spent(failed=2), None),
    ("failed reached", Budget(40, max_failed_trials=3), Spent(failed=3), "max_failed_trials"),
    (
        "failures first, then goal, gpu, wall",
        Budget(40, max_wall_s=1, max_gpu_hours=1, goal=0, max_failed_trials=1),
        Spent(wall_s=2, gpu_hours=2, best=1, failed=1),
        "max_failed_trials",
    ),
    (
        "goal before gpu hours and wall",
        Budget(40, max_wall_s=1, max_gpu_hours=1, goal=0),
        Spent(wall_s=2, gpu_hours=2, best=1),
        "goal",
    ),
]


@pytest.mark.parametrize(
    ("budget", "spent", "expected"), [r[1:] for r in TABLE], ids=[r[0] for r in TABLE]
)
def test_which_budget_ends_the_run(budget: Budget, spent: Spent, expected: str | None) -> None:
    stop = reached(budget, spent)

    assert (stop.budget if stop else None) == expected


def test_only_failures_stop_the_run_as_failing() -> None:
    failing = reached(Budget(40, max_failed_trials=1), Spent(failed=1))
    goal = reached(Budget(40, goal=0), Spent(best=1))

    assert failing is not None and failing.failing
    assert goal is not None and not goal.failing


def test_the_lines_say_what_was_reached() -> None:
    hard = reached(Budget(40, max_wall_s=60, hard_wall=True), Spent(wall_s=61))
    gpu = reached(Budget(40, max_gpu_hours=2), Spent(gpu_hours=2.5))

    assert hard is not None and hard.line == (
        "stopped: max_wall_s = 60 reached; trials in flight stopped for a later run"
    )
    assert gpu is not None and gpu.line == "stopped: 2.5 GPU-hours used (max_gpu_hours = 2)"


def test_usage_lists_every_budget_set_with_what_is_used() -> None:
    spent = Spent(finished=12, failed=1, wall_s=3601.26, gpu_hours=0.123456, best=0.8)

    used = usage(Budget(40, max_wall_s=7200, goal=0.9), spent)

    assert used == {
        "n_trials": BudgetUse(limit=40, used=12),
        "max_wall_s": BudgetUse(limit=7200, used=3601.3),
        "goal": BudgetUse(limit=0.9, used=0.8),
    }
    assert used["goal"].to_json() == {"limit": 0.9, "used": 0.8}


def test_gpu_hours_count_the_trials_that_ran_on_a_gpu_across_runs() -> None:
    """A re-run's ledger reads each finished trial's record: those with a GPU reading count
    their duration x GPUs; a CPU-only trial counts none (issue 39, item 8)."""
    import optuna

    from trialq.driver.ledger import Ledger

    study = optuna.create_study()
    records = [
        {"duration_s": 1800.0, "gpus": 2, "gpu_model": "NVIDIA H100"},  # 1 GPU-hour
        {"duration_s": 3600.0, "gpus": 1, "gpu_peaks_bytes": [2**30]},  # 1 GPU-hour
        {"duration_s": 7200.0, "gpus": 1},  # a CPU-only worker's trial: none
    ]
    for attrs in records:
        study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs=attrs))

    ledger = Ledger(study, lambda: 0.0, Budget(10, max_gpu_hours=3))
    ledger.open()

    assert ledger.gpu_hours == 2.0
    assert reached(ledger.budget, ledger.spent()) is None
