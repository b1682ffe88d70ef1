"""Tiny trial entrypoints for the tests (rq's habit: one module of small job functions)."""

from __future__ import annotations

import os
import time
from typing import Any

from trialq import TrialContext, TrialPruned


def quadratic(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Peak at x = 2; also says which process ran it."""
    return {"score": -((params["x"] - 2.0) ** 2), "pid": float(os.getpid())}


def one_argument(params: dict[str, Any]) -> float:
    """The one-argument form of an entrypoint, returning a bare number."""
    return float(params["x"]) * 10


def raises(params: dict[str, Any], trial: TrialContext) -> float:
    """Fails on a known parameter value, succeeds otherwise."""
    if params["x"] == "bad":
        raise ValueError("refusing x=bad on purpose")
    return 1.0


def sleeps_then_echoes(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Sleeps as long as its param says, then returns a value derived from it.

    Trials sent first sleep longest, so results arrive out of submission order.
    """
    time.sleep(params["sleep_s"])
    return {"echo": params["sleep_s"] * 100 + trial.number * 0.0}


def several_metrics(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Returns two metrics, so a spec without `metric` cannot pick one."""
    return {"a": 1.0, "b": 2.0}


def reports_curve(params: dict[str, Any], trial: TrialContext) -> float:
    """Reports a learning curve; stops when pruned."""
    for step in range(10):
        trial.report(params["x"] * (step + 1), step)
        if trial.should_prune():
            raise TrialPruned()
        time.sleep(0.05)
    return params["x"] * 10.0


def not_a_function() -> None:
    """Placeholder so the module has another callable."""


NOT_CALLABLE = 3
