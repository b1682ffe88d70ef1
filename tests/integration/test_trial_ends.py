"""How a trial's own end is told, with real workers on the real Redis: a diverged objective
(NaN, inf) fails the trial and the study goes on; a trial process that ends itself (a signal,
`sys.exit`, `os._exit`) while its worker lives is the trial's crash, named and not retried
unless the spec says so (issue 26, items 1 and 9)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration


def _run(spec: Path, redis_url: str) -> dict[str, Any]:
    return submit_study(spec, Settings(broker_url=redis_url), None, None, None, show_progress=False)


def _by_param(summary: dict[str, Any], name: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for trial in summary["trials"]:
        found.setdefault(trial["params"][name], []).append(trial)
    return found


def test_a_nan_objective_fails_its_trial_and_the_study_goes_on(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "diverging"
        direction = "minimize"
        metric = "loss"
        n_trials = 4
        sampler = "grid"
        [trial]
        entrypoint = "trials:diverges"
        [space.x]
        type = "categorical"
        choices = ["nan", "fine"]
        """
    )
    summary = _run(spec, redis_url)

    assert len(summary["trials"]) == 4
    by_x = _by_param(summary, "x")
    for trial in by_x["nan"]:
        assert trial["state"] == "FAIL"
        assert trial["user_attrs"]["outcome"] == "not_finite"
        assert trial["user_attrs"]["error"] == "objective is not finite: loss = nan"
    for trial in by_x["fine"]:
        assert trial["state"] == "COMPLETE" and trial["values"] == [0.5]
        assert trial["user_attrs"]["metrics"] == {"loss": 0.5, "grad_norm": "inf"}
    assert summary["best_value"] == 0.5


CRASHES = {
    "segv": "signal 11 (SIGSEGV)",
    "exit0": "exitcode 0",  # sys.exit(0): the pool sees its process end, as for os._exit
    "os_exit": "exitcode 3",
}


def _crash_spec(write_spec: Callable[..., Path], name: str, extra: str = "") -> Path:
    return write_spec(
        f"""
        [study]
        name = "{name}"
        n_trials = 4
        sampler = "grid"
        [trial]
        entrypoint = "trials:ends_its_own_process"
        max_retries = 2
        {extra}
        [space.how]
        type = "categorical"
        choices = ["segv", "exit0", "os_exit", "return"]
        """
    )


def test_a_trial_that_ends_its_own_process_is_a_crash_named_and_not_retried(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    summary = _run(_crash_spec(write_spec, "crashing"), redis_url)

    by_how = _by_param(summary, "how")
    assert [t["state"] for t in by_how["return"]] == ["COMPLETE"]
    for how, named in CRASHES.items():
        (trial,) = by_how[how]
        attrs = trial["user_attrs"]
        assert trial["state"] == "FAIL", how
        assert attrs["outcome"] == "crashed", (how, attrs)
        assert named in attrs["error"], (how, attrs["error"])
        assert attrs["attempts"] == 1 and attrs["retries"] == 0, (how, attrs)


def test_retry_crashes_re_sends_a_crashed_trial_within_max_retries(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = _crash_spec(write_spec, "crash-retried", "retry_crashes = true")
    summary = _run(spec, redis_url)

    for trial in _by_param(summary, "how")["segv"]:
        assert trial["user_attrs"]["outcome"] == "crashed"
        assert trial["user_attrs"]["attempts"] == 3 and trial["user_attrs"]["retries"] == 2


def test_trials_failing_the_same_way_stop_the_run_and_keep_the_budget(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    from trialq.errors import FailingTrials

    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "same-failure"
        n_trials = 40
        max_in_flight = 1
        max_failures_in_a_row = 3
        [trial]
        entrypoint = "trials:fails_the_same_way"
        [space.x]
        type = "float"
        low = 0
        high = 1
        """
    )
    with pytest.raises(FailingTrials, match="3 trials in a row error the same way") as stopped:
        _run(spec, redis_url)

    assert "no module named 'the_users_helper'" in str(stopped.value)
    assert stopped.value.exit_code == 5
    assert stopped.value.summary is not None
    assert stopped.value.summary["stopped_by"] == "max_failures_in_a_row"
    study = optuna.load_study(
        study_name="same-failure", storage=f"sqlite:///{spec.parent / 'same-failure.db'}"
    )
    assert [t.state.name for t in study.trials] == ["FAIL"] * 3  # 37 of 40 kept


def test_an_attempt_killed_at_its_hard_limit_is_told_with_its_own_log_file(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    """Its process wrote no result, so the driver names the log its beacon named: the file
    a user opens when a trial times out (issue 39, item 7)."""
    start_workers(1)
    spec = write_spec(
        """
        [study]
        name = "killed-logged"
        n_trials = 1
        [trial]
        entrypoint = "trials:prints_then_ignores_the_soft_limit"
        timeout_s = 1
        kill_grace_s = 2
        [space.x]
        type = "float"
        low = 0
        high = 1
        """
    )
    (trial,) = _run(spec, redis_url)["trials"]

    attrs = trial["user_attrs"]
    assert trial["state"] == "FAIL" and attrs["outcome"] == "timeout", attrs
    log = Path(attrs["log_file"])
    assert log.name == "trial-0-attempt-1.log", attrs
    assert "trial 0 reached its slow step" in log.read_text()
