"""A trial that only waits: for trying a cluster out (and its fault tests) in seconds.

It reports once a second, so the pruner and the progress have something to show, and returns
a value that depends on its params, so the sampler has something to learn.
"""

from __future__ import annotations

import time
from typing import Any

from trialq.trial.context import TrialContext


def train(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Sleep `sleep_s` seconds (default 5); the score is highest at x = 1."""
    seconds = float(params.get("sleep_s", 5.0))
    started = time.monotonic()
    step = 0
    while (waited := time.monotonic() - started) < seconds:
        time.sleep(min(1.0, seconds - waited))
        step += 1
        trial.report(-((float(params.get("x", 0.0)) - 1.0) ** 2) * step / seconds, step)
    return {"score": -((float(params.get("x", 0.0)) - 1.0) ** 2)}
