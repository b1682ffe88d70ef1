"""What `python -m benchmarks.gpu` runs, in what order, and how its runs are summed up.

Pure: no GPU, no process; the CPU tests hold it (tests/unit/test_gpu_benchmark_plan.py).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

MIN_TRIALS = 16
MIN_WAVES = 3


def interleaved(packings: tuple[int, ...], repeats: int) -> list[int]:
    """Each packing `repeats` times, rounds alternating direction (1,4,8 then 8,4,1 then
    1,4,8): a drift over the call (a card warming up, a cache filling) falls on every packing
    alike instead of on whichever ran first."""
    if repeats < 1 or not packings:
        raise ValueError("a schedule needs one packing and one repeat at least")
    order: list[int] = []
    for round_number in range(repeats):
        order += list(packings if round_number % 2 == 0 else reversed(packings))
    return order


def trials_for(in_flight: int, minimum: int = MIN_TRIALS, waves: int = MIN_WAVES) -> int:
    """Trials a run needs: `minimum`, and enough for `waves` full waves at `in_flight`."""
    return max(minimum, waves * in_flight)


def waves(trials: int, in_flight: int) -> int:
    return math.ceil(trials / in_flight)


def spread(values: list[float]) -> dict[str, Any]:
    """The median of repeated runs with what brackets it; one run says it has no spread."""
    if not values:
        return {"runs": 0}
    return {
        "runs": len(values),
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "values": [round(v, 3) for v in values],
    }


def ratios(medians: dict[int, float], base: int = 1) -> dict[str, float]:
    """Each packing's median trials/h over the median at `base` (one trial a GPU)."""
    if base not in medians or not medians[base]:
        return {}
    return {f"{p}/{base}": round(m / medians[base], 2) for p, m in sorted(medians.items())}


@dataclass
class Deadline:
    """The call's time: a run not started by `seconds` is recorded as not run, so the whole
    command ends inside its lease with what it measured written."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def allows(self, needed_s: float = 0.0) -> bool:
        return self.left() > needed_s
