"""A trial's start cost with its framework preloaded and without, on this machine (CPU).

`python -m benchmarks.framework_start [--trials N]`: a fork-per-trial loop, as a trialq
worker runs trials (`worker_max_tasks_per_child=1`: each trial's process is forked from the
worker's parent), whose parent imports a set of modules first (`TRIALQ_PRELOAD`'s), then
forks one child per trial; each child runs a tiny PyTorch trial (a linear model, one Adam
step) and exits. Prints one JSON line per preload: seconds per trial, mean and median.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

PRELOADS = ("", "torch", "torch,torch._dynamo")


def trial() -> None:
    """What the child runs: import, build, one optimizer step (as a trial's first step)."""
    import torch

    model = torch.nn.Linear(16, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(32, 16)).pow(2).mean().backward()
    optimizer.step()


def loop(preload: str, trials: int) -> list[float]:
    """Seconds from fork to the child's exit, per trial, after the parent preloaded."""
    for name in filter(None, preload.split(",")):
        importlib.import_module(name)
    return forked_cycles(trial, trials)


def forked_cycles(child: Callable[[], None], trials: int) -> list[float]:
    """Seconds from fork to exit of `trials` children, each running `child` and exiting."""
    times = []
    for _ in range(trials):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            child()
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--preload", help=argparse.SUPPRESS)  # one loop, in its own process
    args = parser.parse_args()
    if args.preload is not None:
        print(json.dumps(loop(args.preload, args.trials)))
        return
    for preload in PRELOADS:
        command = [sys.executable, "-m", "benchmarks.framework_start", "--trials"]
        run = subprocess.run([*command, str(args.trials), "--preload", preload],
                             capture_output=True, text=True, check=True)  # fmt: skip
        times = json.loads(run.stdout)
        print(json.dumps({
            "preload": preload or "(nothing)", "trials": len(times),
            "mean_s": round(statistics.fmean(times), 3),
            "median_s": round(statistics.median(times), 3),
        }))  # fmt: skip


if __name__ == "__main__":
    main()
