"""What a trial waits for its driver: a `trial.suggest_*` round trip and `should_prune()`'s
wait for the verdict on the step just reported.

`python -m benchmarks.suggest [--quick] [--out FILE]` runs a study through `trialq.optimize`
on one local worker (an embedded Redis, as `submit-study --local`). Each trial suggests
`NAMES` params the study has not seen (each one round trip: the driver draws it on its live
trial and commits it before answering, so the storage's commit is most of it: `--storage`
names a PostgreSQL, say) and reports and asks `should_prune()` `STEPS` times,
timing each call in its own process; the timings come back as the trial's metrics. Printed
as a table (median, p90, max over every call) and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NAMES = 20
STEPS = 20


def timed_objective(trial: Any) -> dict[str, float]:
    """Suggests new names and waits for verdicts, timing each: the study's metrics."""
    suggests, verdicts = [], []
    base = f"t{trial.number}_"  # a name no earlier trial drew: a round trip each
    for index in range(NAMES):
        started = time.perf_counter()
        trial.suggest_float(base + str(index), 0.0, 1.0)
        suggests.append(time.perf_counter() - started)
    for step in range(STEPS):
        trial.report(float(step), step)
        started = time.perf_counter()
        trial.should_prune()
        verdicts.append(time.perf_counter() - started)
    timings = {f"suggest_{i}": s for i, s in enumerate(suggests)}
    timings.update({f"verdict_{i}": s for i, s in enumerate(verdicts)})
    return {"value": 0.0, **timings}


def _summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "n": len(ordered),
        "median_ms": statistics.median(ordered) * 1000,
        "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 trials instead of 10")
    parser.add_argument("--out", type=Path, default=None, help="the JSON's path")
    parser.add_argument("--storage", default=None, help="the study's storage (default SQLite)")
    args = parser.parse_args(argv)
    import trialq

    n_trials = 3 if args.quick else 10
    with tempfile.TemporaryDirectory(prefix="trialq-suggest-bench-") as folder:
        study = trialq.optimize(
            "benchmarks.suggest:timed_objective", n_trials=n_trials, metric="value",
            workers=1, directory=folder, progress=False, max_in_flight=1, storage=args.storage,
            name=f"suggest-bench-{int(time.time())}",
        )  # fmt: skip
        attrs = [t.user_attrs["metrics"] for t in study.trials if t.state.name == "COMPLETE"]
    suggests = [float(v) for a in attrs for k, v in a.items() if k.startswith("suggest_")]
    verdicts = [float(v) for a in attrs for k, v in a.items() if k.startswith("verdict_")]
    result = {
        "trials": len(attrs),
        "suggest_round_trip": _summary(suggests),
        "should_prune_wait": _summary(verdicts),
        "storage": (args.storage or "sqlite").split(":")[0],
        "when": time.strftime("%Y-%m-%d"),
    }
    print("| wait | calls | median | p90 | max |\n|---|---|---|---|---|")
    for name in ("suggest_round_trip", "should_prune_wait"):
        row = result[name]
        assert isinstance(row, dict)
        print(f"| {name} | {row['n']:.0f} | {row['median_ms']:.2f} ms | {row['p90_ms']:.2f} ms "
              f"| {row['max_ms']:.2f} ms |")  # fmt: skip
    out = args.out or Path("benchmarks/results") / f"suggest-{int(time.time())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"written: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
