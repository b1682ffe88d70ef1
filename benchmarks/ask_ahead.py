"""What asking ahead (`[study] ask_ahead`) saves: the time each worker waits for its next trial.

    python -m benchmarks.ask_ahead [--trials 40] [--workers 4] [--trial-s 2] [--ahead 0 1 2]

Each row runs one study of `--trials` trials through `--workers` local workers (nothing
preloaded) with the real `StudyDriver` in this process, as many in flight as workers, with
trialq's default sampler (`auto`: GP and TPE taking turns at this size, whose ask takes a
tenth of a second to seconds) over six float parameters; each trial sleeps `--trial-s`
(`benchmarks.trials:sleeper`). It reports the study's wall time; the workers' idle time a
trial, that is the wall time times the workers less the trials' own durations, over the
trials (a process forked a trial is in it, in every row alike); and the driver's asks, timed
around `Sender.ask`. The rows run one after the other on the same machine, SQLite in a
temporary folder. One seed: the best values are shown, not compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import optuna

from benchmarks.overhead import RESULTS, ROOT, environment, tree_path
from trialq._celery.dispatcher import CeleryDispatcher
from trialq.driver.ledger import budget_for
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.progress import NoProgress
from trialq.driver.study import open_study
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.spec import load_spec

PARAMS = 6


def write_spec(folder: Path, n_trials: int, workers: int, ahead: int) -> Path:
    space = "".join(
        f"""
        [space.x{i}]
        type = "float"
        low = -1.0
        high = 1.0
        """
        for i in range(PARAMS)
    )
    path = folder / "ask-ahead.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "ask-ahead-{ahead}"
            direction = "minimize"
            n_trials = {n_trials}
            max_in_flight = {workers}
            ask_ahead = {ahead}
            sampler_args = {{ seed = 0 }}
            pruner = "none"
            [trial]
            entrypoint = "benchmarks.trials:sleeper"
            timeout_s = 600
            """
        )
        + textwrap.dedent(space)
    )
    return path


def run(args: argparse.Namespace, ahead: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = load_spec(write_spec(folder, args.trials, args.workers, ahead))
        study = open_study(spec, f"sqlite:///{folder / 'ask-ahead.db'}")
        env = {"PYTHONPATH": tree_path(), "TRIALQ_PRELOAD": "none",
               "BENCH_TRIAL_S": str(args.trial_s)}  # fmt: skip
        with LocalCluster(args.workers, "gpu", ("benchmarks",), extra_env=env) as cluster:
            dispatcher = CeleryDispatcher(Settings(broker_url=cluster.broker_url))
            options = DriverOptions(max_in_flight=args.workers)
            budget = budget_for(spec, args.trials)
            driver = StudyDriver(spec, study, dispatcher, NoProgress(), options, budget=budget)
            asks: list[float] = []
            ask = driver.sender.new_trials.ask

            def timed_ask() -> optuna.Trial:
                started = time.perf_counter()
                try:
                    return ask()
                finally:
                    asks.append(time.perf_counter() - started)

            driver.sender.new_trials.ask = timed_ask  # type: ignore[method-assign]
            started = time.perf_counter()
            driver.run()
            wall_s = time.perf_counter() - started
        trials = study.get_trials(deepcopy=False)
    ran_s = sum(t.user_attrs.get("duration_s") or 0.0 for t in trials)
    return {
        "ask_ahead": ahead, "trials": len(trials), "workers": args.workers,
        "trial_s": args.trial_s, "wall_s": round(wall_s, 2),
        "idle_a_trial_s": round((wall_s * args.workers - ran_s) / len(trials), 3),
        "asks": len(asks), "ask_s_median": round(statistics.median(asks), 3),
        "ask_s_max": round(max(asks), 3), "ask_s_total": round(sum(asks), 2),
        "best": min(t.value for t in trials if t.value is not None),
        "states": sorted({t.state.name for t in trials}),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ask_ahead", description=__doc__)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--trial-s", type=float, default=2.0)
    parser.add_argument("--ahead", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = []
    print("ask_ahead  wall s  idle a trial s  asks  ask s median  max   total  best")
    for ahead in args.ahead:
        row = run(args, ahead)
        rows.append(row)
        print(f"{ahead:9d} {row['wall_s']:7.1f} {row['idle_a_trial_s']:15.3f} {row['asks']:5d} "
              f"{row['ask_s_median']:13.3f} {row['ask_s_max']:5.2f} {row['ask_s_total']:6.1f} "
              f"{row['best']:.3f}", flush=True)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"ask-ahead-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"benchmark": "ask_ahead", "environment": environment(),
                               "rows": rows}, indent=1))  # fmt: skip
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
