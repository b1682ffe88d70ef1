"""The end-to-end benchmark's trials (benchmarks/end_to_end.py): no framework at all.

Apart from `benchmarks.trials`, whose source names TensorFlow: `--local` preloads the
framework a study's entrypoint module imports, so a no-op study written there measured
TensorFlow's preload (10.8 s to the first trial, against 3.2 s without) rather than what a
study that uses no framework costs. The TensorFlow preload is its own row (`trialq-tf`).
"""

from __future__ import annotations

from typing import Any


def stamped_noop(params: dict[str, Any], trial: object = None) -> dict[str, float]:
    """Nothing, stamping when it started and ended (`time.time()`): the end-to-end benchmark
    reads a trial's cost from the stamps of consecutive trials."""
    import time

    started = time.time()
    return {"value": float(params["x"]), "started_at": started, "ended_at": time.time()}


def stamped_second(params: dict[str, Any], trial: object = None) -> dict[str, float]:
    """One second of sleep, stamped as `stamped_noop` is."""
    import time

    started = time.time()
    time.sleep(1.0)
    return {"value": float(params["x"]), "started_at": started, "ended_at": time.time()}
