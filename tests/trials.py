"""Tiny trial entrypoints for the tests (rq's habit: one module of small job functions)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil

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


def records_its_process(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Notes its pid in `params["log"]`, and how many earlier trial processes still ran then.

    With `linger_s`, its process takes that long to exit once asked to (as one tearing down a
    large GPU context does): a later trial must not start meanwhile.
    """
    linger_s = float(params.get("linger_s", 0.0))
    if linger_s:
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(linger_s), os._exit(0)))
    log = Path(str(params["log"]))
    earlier = [int(pid) for pid in log.read_text().split()] if log.exists() else []
    still_running = [pid for pid in earlier if _running(pid)]
    with log.open("a") as out:
        out.write(f"{os.getpid()}\n")
    time.sleep(float(params.get("sleep_s", 0.0)))
    return {
        "pid": float(os.getpid()),
        "earlier_still_running": float(len(still_running)),
        "tensorflow_loaded": float("tensorflow" in sys.modules),
    }


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kills_its_process(params: dict[str, Any], trial: TrialContext) -> float:
    """Dies the way an out-of-memory kill looks from outside: SIGKILL, no result."""
    os.kill(os.getpid(), signal.SIGKILL)
    return 0.0


def ignores_the_soft_limit(params: dict[str, Any], trial: TrialContext) -> float:
    """Swallows SoftTimeLimitExceeded and keeps going until the hard limit kills it."""
    deadline = time.monotonic() + float(params["sleep_s"])
    while time.monotonic() < deadline:
        with contextlib.suppress(BaseException):  # SoftTimeLimitExceeded, on purpose
            time.sleep(0.05)
    return 1.0
