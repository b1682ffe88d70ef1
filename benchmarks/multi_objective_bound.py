"""What bounding TPE's history does to a study of several objectives: ask time and hypervolume.

    python -m benchmarks.multi_objective_bound [--histories 500 1000 3000] [--repeats 3]
        [--seeds 8] [--trials 300] [--kept 25 75] [--out FILE]

Optuna's TPE reads every finished trial on each ask; with several objectives it also ranks
them all into non-dominated fronts and calls good its best `ceil(n / 10)`, with no cap, so
an ask's cost grows with the study. `BoundedTPE` (`trialq.driver.sampling.history`) shows it,
past 500 finished trials, only the first whole fronts holding 50 trials or more and the 450
most recent. Two measurements, both on COCO's `bbob-biobj` f2 at 5-D (bbob's sphere against
its separable ellipsoid, instance 1, x in [-5, 5]; each value on a log scale from about its
optimum, so that neither objective's range swamps the hypervolume):

- ask time: the median of 16 asks once `--histories` trials have finished (drawn at random,
  left running: what is timed is reading and fitting them), for the installed Optuna's
  `TPESampler(seed=0)` and the same behind the bound, measured by turns `--repeats` times
  (the least median kept: a shared machine's load falls on both alike);
- search quality: `--seeds` studies of `--trials` trials, 4 in flight, of each, with the bound
  lowered to `--kept` (best, recent: 25 + 75 by default, so that it acts from the 101st
  trial of a study this benchmark can afford), scored by the hypervolume of the trials'
  values up to the worst of the study's first ten (random, the same for both: the seed's)
  on each objective; the paired per-seed difference (bounded minus unbounded, higher is
  better) with its 90% bootstrap interval.

Writes JSON (default benchmarks/last_multi_objective_bound.json) and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.distributions import FloatDistribution

from benchmarks.parallel_search import bootstrap_interval, environment
from benchmarks.search_objectives import hypervolume_2d
from trialq.driver.sampling.history import BoundedTPE

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "last_multi_objective_bound.json"
DIMENSION = 5
IN_FLIGHT = 4
SPACE = {f"x{i}": FloatDistribution(-5.0, 5.0) for i in range(DIMENSION)}


@functools.cache
def _problem() -> Any:
    import cocoex

    chosen = f"function_indices:2 dimensions:{DIMENSION} instance_indices:1"
    return cocoex.Suite("bbob-biobj", "", chosen)[0]


@functools.cache
def _floors() -> np.ndarray:
    """About each objective's optimum: the least of 20,000 seeded uniform points, less 1."""
    points = np.random.default_rng(0).uniform(-5, 5, (20_000, DIMENSION))
    return np.min([_problem()(x) for x in points], axis=0) - 1.0


def values(params: dict[str, Any]) -> list[float]:
    """The two objectives at `params`, each on a log scale from about its optimum."""
    raw = _problem()(np.array([params[f"x{i}"] for i in range(DIMENSION)]))
    return [math.log10(max(v, 1.0)) for v in raw - _floors()]


def ask_time(sampler: optuna.samplers.BaseSampler, history: int) -> tuple[float, int]:
    """Median seconds of 16 asks after `history` random finished trials, each left running,
    and how many trials the sampler read at its last ask."""
    study = optuna.create_study(
        directions=["minimize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0)
    )
    for _ in range(history):
        trial = study.ask(SPACE)
        study.tell(trial, values(trial.params))
    study.sampler = sampler
    seconds = []
    for _ in range(16):
        started = time.perf_counter()
        study.ask(SPACE)
        seconds.append(time.perf_counter() - started)
    read = sampler._seen(study) if isinstance(sampler, BoundedTPE) else study
    return statistics.median(seconds), len(read._get_trials(deepcopy=False))


def hypervolume(sampler: optuna.samplers.BaseSampler, n_trials: int) -> float:
    """A study of `n_trials`, `IN_FLIGHT` running at once (the oldest told first)."""
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    running: list[optuna.Trial] = []
    points: list[tuple[float, float]] = []
    for _ in range(n_trials + IN_FLIGHT - 1):
        if len(study.trials) < n_trials:
            running.append(study.ask(SPACE))
        if len(running) == IN_FLIGHT or len(study.trials) == n_trials:
            trial = running.pop(0)
            first, second = values(trial.params)
            study.tell(trial, [first, second])
            points.append((first, second))
    reference = (max(p[0] for p in points[:10]), max(p[1] for p in points[:10]))
    return hypervolume_2d(points, reference)


def ask_times(histories: list[int], repeats: int) -> dict[str, dict[str, float]]:
    """Per history, each sampler's ask time (the least of `repeats` medians, the two
    measured by turns: a shared machine's load falls on both alike) and the trials it read."""
    found: dict[str, dict[str, float]] = {}
    for history in histories:
        plain, bounded = [], []
        for _ in range(repeats):
            seconds, read_plain = ask_time(optuna.samplers.TPESampler(seed=0), history)
            plain.append(seconds)
            seconds, read_bounded = ask_time(BoundedTPE(seed=0), history)
            bounded.append(seconds)
        found[str(history)] = {
            "optuna_tpe_ms": 1000 * min(plain),
            "bounded_ms": 1000 * min(bounded),
            "optuna_tpe_reads": read_plain,
            "bounded_reads": read_bounded,
        }
        print(
            f"  {history:>6}: TPESampler {1000 * min(plain):7.1f} ms, {read_plain} trials "
            f"read; bounded {1000 * min(bounded):7.1f} ms, {read_bounded}",
            flush=True,
        )
    return found


def quality(seeds: int, n_trials: int, best: int, recent: int) -> dict[str, Any] | None:
    """Hypervolume of each seed's study with and without the bound, and the paired
    difference's median with its 90% bootstrap interval."""
    if seeds < 1:
        return None
    runs = []
    for seed in range(seeds):
        plain = hypervolume(optuna.samplers.TPESampler(seed=seed), n_trials)
        bounded = hypervolume(BoundedTPE(seed=seed, kept_best=best, kept_recent=recent), n_trials)
        runs.append({"seed": seed, "optuna_tpe": plain, "bounded": bounded})
        print(
            f"  seed {seed}: hypervolume TPESampler {plain:.4f}  bounded {bounded:.4f}", flush=True
        )
    differences = [r["bounded"] - r["optuna_tpe"] for r in runs]
    low, high = bootstrap_interval(differences)
    print(
        f"hypervolume after {n_trials} trials, bounded minus TPESampler (higher is better), "
        f"median over {seeds} seeds: {statistics.median(differences):+.4f} "
        f"[{low:+.4f}, {high:+.4f}]"
    )
    return {
        "trials": n_trials,
        "in_flight": IN_FLIGHT,
        "kept_best": best,
        "kept_recent": recent,
        "median_optuna_tpe": statistics.median(r["optuna_tpe"] for r in runs),
        "median_bounded": statistics.median(r["bounded"] for r in runs),
        "median_difference": statistics.median(differences),
        "p05": low,
        "p95": high,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multi_objective_bound")
    parser.add_argument("--histories", nargs="+", type=int, default=[500, 1000, 3000])
    parser.add_argument("--repeats", type=int, default=3, help="ask-time measurements each")
    parser.add_argument("--seeds", type=int, default=8, help="0: ask time only")
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--kept", nargs=2, type=int, default=[25, 75])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    started = time.perf_counter()
    print("ask time (median ms of 16 asks, left running) after N finished trials")
    asks = ask_times(args.histories, args.repeats)
    found = quality(args.seeds, args.trials, *args.kept)
    wall_s = time.perf_counter() - started
    document: dict[str, Any] = {
        "benchmark": "multi_objective_bound",
        "objective": "bbob-biobj f2 d5 i1, log scale",
        "ask_ms": asks,
        "quality": found,
        "environment": environment(),
        "wall_s": wall_s,
    }
    args.out.write_text(json.dumps(document, indent=1))
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out} "
          f"({wall_s:.0f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
