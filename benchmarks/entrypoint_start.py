"""A trial's start when its module imports scikit-learn and PyTorch, against a no-op trial's,
with the worker's preload from the entrypoint module (`--preload-from`) and without.

`python -m benchmarks.entrypoint_start [--trials N]`: a fork-per-trial loop, as a trialq
worker runs trials; the parent preloads as `trialq worker --preload none --preload-from
MODULE` would (`prewarm.preload_for`), then forks one child per trial, which imports the
entrypoint module (as the trial process does) and returns. Prints one JSON line per case:
seconds per trial, mean and median, and the ratio to the no-op trial. Goal (issue 39): the
scikit-learn and PyTorch trial, preloaded, within 1.5x of the no-op trial.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.framework_start import forked_cycles

MODULES = {
    "noop": "def train(params):\n    return 1.0\n",
    "sklearn_torch": (
        "import sklearn.ensemble\nimport torch\n"  # a start: the trial's work is its own
        "def train(params):\n    return 1.0\n"
    ),
}
CASES = (("noop", False), ("sklearn_torch", False), ("sklearn_torch", True))


def loop(module: Path, preload: bool, trials: int) -> list[float]:
    """Seconds from fork to the child's exit, per trial, the parent having preloaded."""
    if preload:
        from trialq.worker.prewarm import preload_for

        print(preload_for("none", str(module)).line(), file=sys.stderr)

    def trial() -> None:
        spec = importlib.util.spec_from_file_location(module.stem, module)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
        loaded.train({})

    return forked_cycles(trial, trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--module", type=Path, help=argparse.SUPPRESS)  # one loop, alone
    parser.add_argument("--preload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.module is not None:
        print(json.dumps(loop(args.module, args.preload, args.trials)))
        return
    noop_mean = None
    with tempfile.TemporaryDirectory() as folder:
        for name, preload in CASES:
            module = Path(folder) / f"{name}.py"
            module.write_text(MODULES[name])
            flags = ["--trials", str(args.trials), "--module", str(module)]
            if preload:
                flags.append("--preload")
            command = [sys.executable, "-m", "benchmarks.entrypoint_start", *flags]
            times = json.loads(subprocess.run(command, capture_output=True, text=True,
                                              check=True).stdout)  # fmt: skip
            mean = statistics.fmean(times)
            noop_mean = noop_mean or mean
            print(json.dumps({
                "trial": name, "preloaded_from_module": preload, "trials": len(times),
                "mean_s": round(mean, 3), "median_s": round(statistics.median(times), 3),
                "vs_noop": round(mean / noop_mean, 2),
            }))  # fmt: skip


if __name__ == "__main__":
    main()
