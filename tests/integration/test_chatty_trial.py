"""A trial that reports far more than a pruner needs (issue 26, item 11): the values past the
bound are dropped with a count the trial and the driver both state, and the driver is not
slowed by it (it writes one transaction a relay, not one a value)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from trialq.settings import Settings
from trialq.submit import submit_study
from trialq.trial.report_sender import MAX_REPORTS_PER_ATTEMPT

pytestmark = pytest.mark.integration
REPORTED = 50_000


def test_a_chatty_trial_keeps_the_bound_says_what_it_dropped_and_ends_promptly(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(1)
    spec = write_spec(
        f"""
        [study]
        name = "chatty"
        n_trials = 1
        pruner = "median"
        [trial]
        entrypoint = "trials:chatty"
        [space.n]
        type = "categorical"
        choices = [{REPORTED}]
        """
    )
    started = time.monotonic()
    submit_study(spec, Settings(broker_url=redis_url), None, None, None, show_progress=False)
    took_s = time.monotonic() - started

    study = optuna.load_study(study_name="chatty", storage=f"sqlite:///{spec.parent / 'chatty.db'}")
    (trial,) = study.trials
    assert trial.state.name == "COMPLETE"
    assert trial.intermediate_values == {s: float(s) for s in range(MAX_REPORTS_PER_ATTEMPT)}
    assert trial.user_attrs["reports_dropped"] == REPORTED - MAX_REPORTS_PER_ATTEMPT
    assert took_s < 60, f"a one-trial study of a chatty trial took {took_s:.0f} s"
