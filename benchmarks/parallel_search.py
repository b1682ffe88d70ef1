"""Search quality with many trials in flight: samplers compared on the real driver.

    python -m benchmarks.parallel_search [--quick | --suite coco] [--seeds N] [--first-seed N]
        [--budgets 50 ...] [--jobs N] [--out FILE]

Runs trialq's real `StudyDriver` (its ask/tell loop, in-flight bookkeeping, OOM constraint
and pruner relay) against a simulated cluster on a virtual clock (`virtual_cluster`): k
workers, lognormal trial durations (trials finish out of order), learning curves for the
pruners. The objectives (`search_objectives`) are seeded and noisy: Branin, Hartmann-6, a
training run with a mixed space, a cost and an out-of-memory region, a define-by-run
conditional space, and the training run as a two-objective study (loss, cost). All are
minimised; a study's score is the noise-free value of the best trial it found (for two
objectives, minus the hypervolume of its trials' noise-free values).

For each sampler, k in flight and seed it runs one study of 200 trials; the first 50 and 100
trials of that study are exactly the studies of budget 50 and 100 (the driver asks the same
trials in the same order up to there). Prints, per objective, the median over seeds of the
score after 50/100/200 trials and after two virtual hours; then how much of the gap between
the baseline (the installed Optuna's `TPESampler(seed)`) at k=16 and at k=1 each sampler
closes at k=16, per budget; the driver's ask time per sampler at 200 and 1,000 trials;
writes JSON (default
benchmarks/last_parallel_search.json). The last line is `gap closed at k=16: <fraction>` for
trialq's default sampler: per budget the median over objectives (each objective's gap taken
on medians over seeds), and of the budgets the worst.

`--suite coco` (the tuning part) and `--suite heldout` (the part never tuned on,
`coco_objectives.HELD_OUT`) run objectives the project did not write (`coco_objectives`:
COCO's bbob and bbob-mixint, categorical, log/int, conditional and noisy spaces), the
baseline, trialq's default and random at k = 1 and 16, 20 seeds; they add, per objective and
budget, the median over seeds of the default's score minus the baseline's on the same seed,
with a 90% bootstrap interval (`versus_optuna`), and end `suite: worse than Optuna's TPE
beyond noise: <cells>`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import platform
import random
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from benchmarks.coco_objectives import HELD_OUT, coco_objectives, suite_names
from benchmarks.search_objectives import DEFAULT_RUN, OBJECTIVES, Objective, hypervolume_2d
from benchmarks.virtual_cluster import (
    MEDIAN_TRIAL_S,
    VirtualClock,
    VirtualCluster,
    trial_rng,
)
from trialq.driver.ledger import budget_for
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.outage import Outages
from trialq.driver.progress import NoProgress
from trialq.driver.sampling.distinct import DistinctFromRunning
from trialq.driver.sampling.rule import gp_runs_here
from trialq.driver.sampling.taking_turns import TakingTurns
from trialq.driver.study import make_pruner, make_sampler
from trialq.spec import StudySpec

if importlib.util.find_spec("cocoex") is not None:  # the dev extra installs it
    OBJECTIVES.update(coco_objectives())
SUITE_SEEDS = 20

BUDGETS = (50, 100, 200)
KS = (1, 4, 16, 64)
WALL_S = 2 * 3600.0
"""The virtual wall time the second score is taken at: twelve median trials."""
HV_REFERENCE = (1.2, 5.0)
BASELINE = "tpe-installed"
"""What a user would run instead of trialq: the installed Optuna's `TPESampler(seed=s)`,
exactly as constructed (`baseline_sampler`; tests/unit/test_search_baseline.py)."""
DEFAULT = "default"
REDRAWN = "tpe-installed-redrawn"
"""The baseline on other draws (its seed moved, the cluster's kept): two samplers of the same
quality, so each "worse beyond noise" cell it shows against the baseline is chance alone."""
ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "last_parallel_search.json"


@dataclass(frozen=True)
class Variant:
    """A sampler as a spec names it (`sampler`, `sampler_args`)."""

    sampler: str
    args: dict[str, Any] = field(default_factory=dict)
    multivariate: bool = False
    """Add `group = true` on a define-by-run space (multivariate TPE needs it there)."""
    wrapped: bool = False
    """Keep trialq's wrapper (distinct draws) though `args` are given."""
    installed: bool = False
    """Optuna's `TPESampler(seed=s)` itself, not through the spec (`baseline_sampler`)."""
    seed_offset: int = 0
    """Added to the study's seed for the sampler alone (the cluster's noise and durations keep
    the study's): the same sampler on other draws, the noise a comparison of two samplers of
    equal quality shows."""


VARIANTS: dict[str, Variant] = {
    BASELINE: Variant("tpe", installed=True),
    REDRAWN: Variant("tpe", installed=True, seed_offset=1_000_003),
    # Optuna 4's defaults (independent, no liar): the baseline of records before 2026-12-06.
    "tpe-optuna4": Variant("tpe", {"multivariate": False, "constant_liar": False}),
    "tpe+liar": Variant("tpe", {"multivariate": False, "constant_liar": True}),
    "tpe+mv": Variant("tpe", {"multivariate": True, "constant_liar": False}, multivariate=True),
    "tpe+mv+liar": Variant("tpe", {"multivariate": True, "constant_liar": True}, multivariate=True),
    DEFAULT: Variant("auto"),  # whatever the default, `sampler = "auto"`, builds
    "tpe": Variant("tpe"),  # what `sampler = "tpe"` builds: the same as `auto`
    "random": Variant("random"),
    # What `tpe` builds with its history bounded at 50 (25 best + 25 latest) instead of 500:
    # how much the bound costs, at a size the search benchmark runs (issue 42).
    "tpe-bounded50": Variant("tpe", {"kept_best": 25, "kept_recent": 25}, wrapped=True),
    "cmaes": Variant("cmaes", {"warn_independent_sampling": False}),
    "nsga2": Variant("nsga2"),
    "gp": Variant("gp"),  # what `sampler = "gp"` builds, behind the distinct draws
    "gp+tpe": Variant("gp+tpe"),  # GP and independent TPE taking turns: `auto` until 12-06
}
MULTI_ONLY = {"nsga2"}
SINGLE_ONLY = {"cmaes", "gp", "gp+tpe"}


def available(label: str) -> bool:
    """CMA-ES needs the `cmaes` package and GP torch and scipy: none is trialq's to require."""
    if label in ("gp", "gp+tpe"):
        return gp_runs_here()
    return label != "cmaes" or importlib.util.find_spec("cmaes") is not None


@dataclass(frozen=True)
class Case:
    """One study to simulate."""

    objective: str
    variant: str
    k: int
    seed: int
    pruner: str = "none"
    n_trials: int = max(BUDGETS)


# --- one study on the simulated cluster ----------------------------------------------------


def spec_for(case: Case) -> StudySpec:
    """The spec a user would write for this study."""
    objective, variant = OBJECTIVES[case.objective], VARIANTS[case.variant]
    args = {**variant.args, "seed": case.seed}
    if variant.multivariate and objective.search_space:
        args["group"] = True
    study: dict[str, Any] = {
        "name": f"{case.objective}-{case.variant.replace('+', '_')}-{case.k}-{case.seed}",
        "n_trials": case.n_trials,
        "max_in_flight": case.k,
        "sampler": variant.sampler,
        "sampler_args": args,
        "pruner": case.pruner,
    }
    if objective.multi:
        study.update(directions=["minimize"] * len(objective.metrics), metrics=objective.metrics)
    else:
        study["direction"] = "minimize"
    if objective.search_space:
        study["search_space"] = objective.search_space
    raw = {
        "path": ROOT / "parallel-search.toml",
        "study": study,
        "trial": {"entrypoint": "benchmarks.search_objectives:conditional_space"},  # never run
        "space": objective.space,
    }
    return StudySpec.model_validate(raw)


def baseline_sampler(seed: int) -> optuna.samplers.BaseSampler:
    """The baseline: the installed Optuna's default TPE, as a user constructs it."""
    return optuna.samplers.TPESampler(seed=seed)


def build_sampler(case: Case, spec: StudySpec) -> optuna.samplers.BaseSampler:
    variant = VARIANTS[case.variant]
    if variant.installed:
        return baseline_sampler(case.seed + variant.seed_offset)
    sampler = make_sampler(spec)
    if variant.args and not variant.wrapped and isinstance(sampler, DistinctFromRunning):
        return sampler.sampler  # TPE with Optuna's arguments: as Optuna builds it
    return sampler


@dataclass
class StudyRun:
    """What one simulated study did: per trial number, its end, and how it is scored."""

    finished_at: dict[int, float]
    observed: dict[int, tuple[float, ...]]
    """Returned values of the trials that completed (not OOM, not pruned, not failed)."""
    true: dict[int, tuple[float, ...]]
    ask_s: dict[int, float]
    wall_s: float


def simulate(case: Case) -> StudyRun:
    """Run the real driver over the virtual cluster until the study is done."""
    objective, spec = OBJECTIVES[case.objective], spec_for(case)
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        directions=list(spec.study.objective_directions),
        sampler=build_sampler(case, spec),
        pruner=make_pruner(spec),
        study_name=spec.study.name,
    )
    clock = VirtualClock()
    cluster = VirtualCluster(objective, case.seed, clock)
    options = DriverOptions(max_in_flight=case.k, poll_interval_s=0.0, clock=clock)
    budget = budget_for(spec, case.n_trials)
    driver = StudyDriver(spec, study, cluster, NoProgress(), options, budget=budget)
    ask_s = time_asks(driver)
    started = time.perf_counter()
    drive(driver, cluster, clock, case.n_trials)
    wall = time.perf_counter() - started
    observed, true = {}, {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        sim = cluster.by_number[trial.number].sim
        if not sim.oom:
            observed[trial.number], true[trial.number] = sim.values, sim.true_values
    finished = {number: run.finishes for number, run in cluster.by_number.items()}
    return StudyRun(finished, observed, true, ask_s, wall)


def drive(driver: StudyDriver, cluster: VirtualCluster, clock: VirtualClock, n: int) -> None:
    """The driver's own `run`, minus its real-time pause: after each pass the clock jumps
    to the next report or end (the driver's `_pause` sleeps on the real clock). A pass with
    no event ahead collects what ended at this instant (a trial the driver just killed)."""
    outages = Outages(driver.options.outage_limit_s, clock)
    idle = 0
    while driver._step(outages):
        upcoming = cluster.next_event(clock.now)
        idle = idle + 1 if upcoming is None else 0
        assert idle < 3, "the driver waits for trials the cluster does not run"
        clock.now = clock.now if upcoming is None else upcoming


def time_asks(driver: StudyDriver) -> dict[int, float]:
    """Seconds each of the driver's asks took (sampler, storage and define-by-run)."""
    seconds: dict[int, float] = {}
    ask = driver.sender.new_trials.ask

    def timed() -> optuna.Trial:
        started = time.perf_counter()
        trial = ask()
        seconds[trial.number] = time.perf_counter() - started
        return trial

    driver.sender.new_trials.ask = timed  # type: ignore[method-assign]
    return seconds


# --- scores --------------------------------------------------------------------------------


def score(run: StudyRun, objective: Objective, budget: int, until: float = math.inf) -> float:
    """The study's best after `budget` trials (and by `until`): lower is better."""
    numbers = [n for n in run.observed if n < budget and run.finished_at[n] <= until]
    if objective.multi:
        points = [(run.true[n][0], run.true[n][1]) for n in numbers]
        return -hypervolume_2d(points, HV_REFERENCE)
    return min((run.true[n][0] for n in numbers), default=math.inf)


def summarise(case: Case) -> dict[str, Any]:
    """One study, simulated and scored (what a worker process sends back)."""
    quiet()
    run = simulate(case)
    objective = OBJECTIVES[case.objective]
    whole = case.n_trials == max(BUDGETS)
    asks = list(run.ask_s.values())
    return {
        **asdict(case),
        "scores": {str(b): score(run, objective, b) for b in budgets_of(case)},
        "at_wall": score(run, objective, case.n_trials, WALL_S) if whole else None,
        "ask_s_total": sum(asks),
        "ask_s_max": max(asks, default=0.0),
        "wall_s": run.wall_s,
        "virtual_h": max(run.finished_at.values(), default=0.0) / 3600,
    }


def budgets_of(case: Case) -> list[int]:
    """The budgets a study stands for: a study of 200 trials holds those of 50 and 100 too
    (no sampler here depends on `n_trials`; tests/unit/test_sampler_default.py holds the
    default to that)."""
    return [b for b in BUDGETS if b <= case.n_trials]


def quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("trialq").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")


# --- the matrix and its tables -------------------------------------------------------------


def cases(
    objectives: Iterable[str],
    variants: Iterable[str],
    ks: Iterable[int],
    seeds: int,
    pruners: dict[str, tuple[str, ...]],
    budgets: tuple[int, ...] = BUDGETS,
    first_seed: int = 0,
) -> list[Case]:
    found = []
    for name in objectives:
        objective = OBJECTIVES[name]
        for label in variants:
            if not available(label):
                continue
            if (label in MULTI_ONLY and not objective.multi) or (
                label in SINGLE_ONLY and objective.multi
            ):
                continue
            lengths = (max(budgets),)
            for pruner in pruners.get(name, ("none",)) if objective.has_curves else ("none",):
                found.extend(
                    Case(name, label, k, seed, pruner, n)
                    for k in ks
                    for seed in range(first_seed, first_seed + seeds)
                    for n in lengths
                )
    return found


def run_all(todo: list[Case], jobs: int) -> list[dict[str, Any]]:
    if jobs <= 1:
        return [summarise(case) for case in todo]
    done = []
    with ProcessPoolExecutor(jobs) as pool:
        for row in pool.map(summarise, todo, chunksize=4):
            done.append(row)
            if len(done) % 100 == 0:
                print(f"  {len(done)}/{len(todo)} studies", file=sys.stderr, flush=True)
    return done


Key = tuple[str, str, str, int]
"""(objective, variant, pruner, k)"""


def medians(results: list[dict[str, Any]]) -> dict[Key, dict[str, float]]:
    """Median over seeds of each score, by objective, variant, pruner and k."""
    grouped: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    for row in results:
        grouped[(row["objective"], row["variant"], row["pruner"], row["k"])].append(row)
    table = {}
    for key, rows in grouped.items():
        by_budget: dict[str, list[float]] = defaultdict(list)
        for row in rows:
            for budget, value in row["scores"].items():
                by_budget[budget].append(value)
        cell = {budget: statistics.median(values) for budget, values in by_budget.items()}
        at_wall = [r["at_wall"] for r in rows if r["at_wall"] is not None]
        cell["wall"] = statistics.median(at_wall) if at_wall else math.nan  # studies of 200
        cell["ask_s"] = statistics.median(r["ask_s_total"] for r in rows)
        table[key] = cell
    return table


def gap_closed(
    table: dict[Key, dict[str, float]],
    objective: str,
    variant: str,
    budget: str,
    pruner: str = "none",
) -> float | None:
    """How much of the baseline's loss from k=1 to k=16 `variant` wins back at k=16 (1: all
    of it; negative: worse than the baseline); None where the baseline loses nothing."""
    try:
        base_1 = table[(objective, BASELINE, pruner, 1)][budget]
        base_16 = table[(objective, BASELINE, pruner, 16)][budget]
        other_16 = table[(objective, variant, pruner, 16)][budget]
    except KeyError:
        return None
    gap = base_16 - base_1
    if not gap > 1e-9:
        return None
    return (base_16 - other_16) / gap


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}" if abs(value) >= 0.01 else f"{value:.2e}"


def print_objective(
    table: dict[Key, dict[str, float]], objective: str, ks: tuple[int, ...], budgets: list[str]
) -> None:
    rows = sorted(
        {(v, p) for (o, v, p, _k) in table if o == objective},
        key=lambda vp: (vp[1] != "none", list(VARIANTS).index(vp[0]), vp[1]),
    )
    what = "-hypervolume" if OBJECTIVES[objective].multi else "best true value"
    print(f"\n{objective}: median {what} over seeds (lower is better)")
    columns = [f"{b}@k{k}" for b in budgets for k in ks] + [f"2h@k{k}" for k in ks]
    print(f"{'sampler':<26}" + "".join(f"{c:>10}" for c in columns) + f"{'deg1→16':>10}")
    for variant, pruner in rows:
        name = variant if pruner == "none" else f"{variant} +{pruner}"
        cells = []
        for column in [*((b, k) for b in budgets for k in ks), *(("wall", k) for k in ks)]:
            cell = table.get((objective, variant, pruner, column[1]))
            cells.append(fmt(cell.get(column[0]) if cell else None))
        last = budgets[-1]
        one, sixteen = (
            table.get((objective, variant, pruner, 1)),
            table.get((objective, variant, pruner, 16)),
        )
        degradation = sixteen[last] - one[last] if one and sixteen else None
        print(f"{name:<26}" + "".join(f"{c:>10}" for c in cells) + f"{fmt(degradation):>10}")


def gap_table(
    table: dict[Key, dict[str, float]], objectives: list[str], budgets: list[str]
) -> dict[str, dict[str, float | None]]:
    """Per variant and budget: the median over objectives of the gap closed at k=16."""
    variants = sorted(
        {v for (_o, v, p, k) in table if k == 16 and p == "none"}, key=list(VARIANTS).index
    )
    closed: dict[str, dict[str, float | None]] = {}
    for variant in variants:
        closed[variant] = {}
        for budget in budgets:
            found = [gap_closed(table, o, variant, budget) for o in objectives]
            kept = [f for f in found if f is not None]
            closed[variant][budget] = statistics.median(kept) if kept else None
    return closed


def print_gaps(
    closed: dict[str, dict[str, float | None]],
    table: dict[Key, dict[str, float]],
    objectives: list[str],
    budgets: list[str],
) -> None:
    print("\ngap closed at k=16 (share of installed TPE's k=1→16 loss won back; median over")
    print("objectives; the default per objective below)")
    print(f"{'sampler':<26}" + "".join(f"{'budget ' + b:>12}" for b in budgets))
    for variant, by_budget in closed.items():
        print(f"{variant:<26}" + "".join(f"{fmt(by_budget[b]):>12}" for b in budgets))
    for objective in objectives:
        per = [fmt(gap_closed(table, objective, DEFAULT, b)) for b in budgets]
        print(f"  {DEFAULT} on {objective:<15}" + "".join(f"{p:>12}" for p in per))


BOOTSTRAP_DRAWS = 1000


def gap_spread(
    results: list[dict[str, Any]], objectives: list[str], budgets: list[str]
) -> dict[str, dict[str, dict[str, float] | None]]:
    """Per objective and budget, the default's gap closed at k=16 with its 90% bootstrap
    interval: the seeds drawn again with replacement (the same draw for the three cells it
    is taken from, which share their seeds), the medians and the gap taken again, 1,000 times.
    None where the baseline loses nothing on the seeds as run."""
    by_cell: dict[tuple[str, str, int, str], dict[int, float]] = defaultdict(dict)
    for row in results:
        if row["pruner"] == "none":
            for budget, value in row["scores"].items():
                by_cell[(row["objective"], row["variant"], row["k"], budget)][row["seed"]] = value
    rng = random.Random(0)
    spread: dict[str, dict[str, dict[str, float] | None]] = {}
    for objective in objectives:
        spread[objective] = {}
        for budget in budgets:
            cells = [
                by_cell.get((objective, BASELINE, 1, budget), {}),
                by_cell.get((objective, BASELINE, 16, budget), {}),
                by_cell.get((objective, DEFAULT, 16, budget), {}),
            ]
            seeds = sorted(set.intersection(*(set(c) for c in cells)))
            as_run = gap_share(cells, seeds)
            if as_run is None:
                spread[objective][budget] = None
                continue
            draws = [
                gap_share(cells, rng.choices(seeds, k=len(seeds))) for _ in range(BOOTSTRAP_DRAWS)
            ]
            kept = sorted(d for d in draws if d is not None)
            spread[objective][budget] = {
                "median": as_run,
                "p05": kept[int(0.05 * len(kept))] if kept else math.nan,
                "p95": kept[int(0.95 * len(kept)) - 1] if kept else math.nan,
                "seeds": len(seeds),
            }
    return spread


def gap_share(cells: list[dict[int, float]], seeds: list[int]) -> float | None:
    """The share of the baseline's 1 -> k loss a sampler wins back, from three cells of
    scores by seed (baseline at 1, baseline at k, the sampler at k), on `seeds`; None where
    the baseline lost nothing."""
    if not seeds:
        return None
    base_1, base_16, other_16 = (statistics.median(c[s] for s in seeds) for c in cells)
    gap = base_16 - base_1
    return (base_16 - other_16) / gap if gap > 1e-9 else None


def print_spread(spread: dict[str, dict[str, dict[str, float] | None]], budgets: list[str]) -> None:
    print(f"\n{DEFAULT}'s gap closed at k=16 per objective, [90% bootstrap interval over seeds]")
    for objective, by_budget in spread.items():
        cells = []
        for budget in budgets:
            cell = by_budget[budget]
            cells.append(
                "no gap" if cell is None
                else f"{fmt(cell['median'])} [{fmt(cell['p05'])}, {fmt(cell['p95'])}]"
            )  # fmt: skip
        print(f"  {objective:<15}" + "".join(f"{c:>28}" for c in cells))


def versus_optuna(
    results: list[dict[str, Any]],
    objectives: list[str],
    budgets: list[str],
    ks: Iterable[int],
    variant: str = DEFAULT,
) -> dict[str, dict[str, dict[str, float] | None]]:
    """Per objective, k and budget: the median over seeds of `variant`'s score minus the
    baseline's on the same seed, at the same k (positive: `variant` is worse), with its
    90% bootstrap interval (the seeds drawn again with replacement, 1,000 times). "Worse
    beyond noise" is an interval wholly above 0."""
    by_cell: dict[tuple[str, str, int, str], dict[int, float]] = defaultdict(dict)
    for row in results:
        if row["pruner"] == "none":
            for budget, value in row["scores"].items():
                by_cell[(row["objective"], row["variant"], row["k"], budget)][row["seed"]] = value
    found: dict[str, dict[str, dict[str, float] | None]] = {}
    for objective in objectives:
        for k in ks:
            for budget in budgets:
                ours = by_cell.get((objective, variant, k, budget), {})
                theirs = by_cell.get((objective, BASELINE, k, budget), {})
                seeds = sorted(set(ours) & set(theirs))
                key = f"k={k} budget={budget}"
                found.setdefault(objective, {})[key] = (
                    paired_cell([ours[s] for s in seeds], [theirs[s] for s in seeds])
                    if seeds
                    else None
                )
    return found


def paired_cell(ours: list[float], theirs: list[float]) -> dict[str, float]:
    """The median per-seed difference `ours - theirs` (seeds in the same order) and its 90%
    bootstrap interval, with both medians."""
    differences = [_paired(a, b) for a, b in zip(ours, theirs, strict=True)]
    low, high = bootstrap_interval(differences)
    return {
        "difference": statistics.median(differences),
        "p05": low,
        "p95": high,
        "default": statistics.median(ours),
        "optuna_tpe": statistics.median(theirs),
        "seeds": len(differences),
    }


def bootstrap_interval(values: list[float], seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of the median of `values` drawn again with replacement
    (`BOOTSTRAP_DRAWS` times, seeded: the same interval every run)."""
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP_DRAWS)
    )
    return medians[BOOTSTRAP_DRAWS // 20], medians[BOOTSTRAP_DRAWS - BOOTSTRAP_DRAWS // 20 - 1]


def _paired(ours: float, theirs: float) -> float:
    if ours == theirs:  # both inf: neither found a scored trial
        return 0.0
    difference = ours - theirs
    return difference if not math.isnan(difference) else math.inf


def worse_beyond_noise(versus: dict[str, dict[str, dict[str, float] | None]]) -> list[str]:
    """`objective k=.. budget=..` of each cell where the sampler's interval is above 0."""
    return _cells_where(versus, lambda cell: cell["p05"] > 0)


def better_beyond_noise(versus: dict[str, dict[str, dict[str, float] | None]]) -> list[str]:
    """`objective k=.. budget=..` of each cell where the sampler's interval is below 0."""
    return _cells_where(versus, lambda cell: cell["p95"] < 0)


def _cells_where(
    versus: dict[str, dict[str, dict[str, float] | None]],
    holds: Callable[[dict[str, float]], bool],
) -> list[str]:
    return [
        f"{objective} {key}"
        for objective, by_key in versus.items()
        for key, cell in by_key.items()
        if cell is not None and holds(cell)
    ]


def noise_floor(versus_redrawn: dict[str, dict[str, dict[str, float] | None]]) -> dict[str, Any]:
    """What chance alone shows: the cells where the baseline on other draws (`REDRAWN`) is
    worse, and better, than itself beyond noise, of the cells compared. A sampler's count of
    worse cells means something only beside this one."""
    compared = [cell for by_key in versus_redrawn.values() for cell in by_key.values() if cell]
    return {
        "cells": len(compared),
        "worse": worse_beyond_noise(versus_redrawn),
        "better": better_beyond_noise(versus_redrawn),
    }


def print_versus(versus: dict[str, dict[str, dict[str, float] | None]]) -> None:
    print(f"\n{DEFAULT} minus Optuna's TPE at the same k, median over seeds [90% bootstrap")
    print("interval]; positive is worse, * where the interval is above 0")
    keys = sorted({key for by_key in versus.values() for key in by_key})
    print(f"{'objective':<20}" + "".join(f"{key:>30}" for key in keys))
    for objective, by_key in versus.items():
        cells = []
        for key in keys:
            cell = by_key.get(key)
            cells.append(
                "-" if cell is None
                else f"{fmt(cell['difference'])} [{fmt(cell['p05'])}, {fmt(cell['p95'])}]"
                + ("*" if cell["p05"] > 0 else " ")
            )  # fmt: skip
        print(f"{objective:<20}" + "".join(f"{c:>30}" for c in cells))


# --- ask time ------------------------------------------------------------------------------


def ask_time(label: str, history: int, asks: int = 8, objective: str = "hartmann6") -> float:
    """Median seconds of the driver's ask once `history` trials have finished, with up to
    `asks` more in flight (the history is drawn at random: what is timed is the sampler
    reading and fitting it, not how it was found)."""
    quiet()
    case = Case(objective, label, k=16, seed=0, n_trials=history + asks)
    spec = spec_for(case)
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        directions=list(spec.study.objective_directions),
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    clock = VirtualClock()
    cluster = VirtualCluster(OBJECTIVES[objective], 0, clock)
    options = DriverOptions(max_in_flight=16, poll_interval_s=0.0, clock=clock)
    driver = StudyDriver(spec, study, cluster, NoProgress(), options)
    for _ in range(history):
        trial = driver.sender.new_trials.ask()
        simulated = cluster.objective.evaluate(trial.params, trial_rng(0, trial.number))
        study.tell(
            trial,
            None if simulated.oom else list(simulated.values),
            state=TrialState.FAIL if simulated.oom else TrialState.COMPLETE,
        )
    study.sampler = build_sampler(case, spec)
    seconds = []
    for _ in range(asks):
        started = time.perf_counter()
        # left running: the liar's cost is part of what a parallel ask pays
        driver.sender.new_trials.ask()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.parallel_search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the baseline and the default at k=1 and 16, 5 seeds: minutes",
    )
    parser.add_argument(
        "--suite",
        choices=["coco", "heldout"],
        help="objectives the project did not write (coco_objectives): `coco`, the tuning "
        "part; `heldout`, the part never tuned on; the baseline, the default and random at "
        f"k=1 and 16, {SUITE_SEEDS} seeds",
    )
    parser.add_argument(
        "--seeds", type=int, help=f"seeds per cell (default 10; --quick 5; --suite {SUITE_SEEDS})"
    )
    parser.add_argument("--first-seed", type=int, default=0, help="seeds from this one (default 0)")
    parser.add_argument(
        "--budgets",
        nargs="+",
        type=int,
        choices=BUDGETS,
        help="only these budgets (studies of the largest; default all three)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--objectives", nargs="+", choices=list(OBJECTIVES))
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS))
    parser.add_argument("--ks", nargs="+", type=int)
    parser.add_argument("--no-pruners", action="store_true", help="skip the pruner variants")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser.parse_args(argv)


def plan(args: argparse.Namespace) -> tuple[list[Case], tuple[int, ...], list[str], list[str]]:
    if args.suite:
        part = HELD_OUT if args.suite == "heldout" else suite_names()
        objectives = args.objectives or list(part)
        variants = args.variants or [BASELINE, DEFAULT, "random", REDRAWN]
        ks, seeds, pruners = tuple(args.ks or (1, 16)), args.seeds or SUITE_SEEDS, {}
    elif args.quick:
        objectives = args.objectives or ["branin", "hartmann6", "train", "conditional"]
        variants = args.variants or [BASELINE, DEFAULT]
        ks, seeds, pruners = tuple(args.ks or (1, 16)), args.seeds or 5, {}
    else:
        objectives = args.objectives or list(DEFAULT_RUN)
        variants = args.variants or list(VARIANTS)
        ks, seeds = tuple(args.ks or KS), args.seeds or 10
        pruners = {} if args.no_pruners else {"train": ("none", "median", "successive_halving")}
    budgets = tuple(sorted(args.budgets or BUDGETS))
    found = cases(objectives, variants, ks, seeds, pruners, budgets, args.first_seed)
    return found, ks, objectives, [str(b) for b in budgets]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.suite and importlib.util.find_spec("cocoex") is None:
        print("--suite coco needs COCO: pip install coco-experiment (the dev extra)")
        return 2
    quiet()
    started = time.perf_counter()
    todo, ks, objectives, budgets = plan(args)
    print(
        f"{len(todo)} studies of up to {max(int(b) for b in budgets)} trials, k in {ks}, "
        f"{len({c.seed for c in todo})} seeds, {args.jobs} process(es)",
        flush=True,
    )
    results = run_all(todo, args.jobs)
    table = medians(results)
    for objective in objectives:
        print_objective(table, objective, ks, budgets)
    closed = gap_table(table, objectives, budgets) if 16 in ks and 1 in ks else {}
    spread = gap_spread(results, objectives, budgets) if closed else {}
    if closed:
        print_gaps(closed, table, objectives, budgets)
        print_spread(spread, budgets)
    versus = versus_optuna(results, objectives, budgets, ks) if args.suite else {}
    if versus:
        print_versus(versus)
    redrawn = any(row["variant"] == REDRAWN for row in results)
    noise = noise_floor(versus_optuna(results, objectives, budgets, ks, REDRAWN)) if redrawn else {}
    quick = args.quick or bool(args.suite)
    asks = ask_times([v for v in dict.fromkeys(c.variant for c in todo)], quick=quick)
    print_ask_times(asks)
    headline = worst([closed.get(DEFAULT, {}).get(b) for b in budgets])
    wall_s = time.perf_counter() - started
    write(args.out, args, results, table, closed, spread, asks, headline, wall_s, versus, noise)
    print(f"gap closed at k=16: {fmt(headline) if headline is not None else 'n/a'}")
    if args.suite:
        worse = worse_beyond_noise(versus)
        print(f"suite: worse than Optuna's TPE beyond noise: {', '.join(worse) or 'none'}")
    if noise.get("cells"):
        print(
            f"noise floor: Optuna's TPE on other draws is worse than itself beyond noise in "
            f"{len(noise['worse'])} of {noise['cells']} cells and better in {len(noise['better'])}"
        )
    return 0


def worst(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return min(kept) if kept else None


def ask_times(variants: list[str], quick: bool) -> dict[str, dict[str, float]]:
    histories = (200, 1000)
    found: dict[str, dict[str, float]] = {}
    for label in variants:
        if label in MULTI_ONLY or not available(label):
            continue
        found[label] = {str(h): ask_time(label, h, asks=4 if quick else 8) for h in histories}
    return found


def print_ask_times(asks: dict[str, dict[str, float]]) -> None:
    print("\ndriver ask time (median ms; hartmann6, up to 8 running) after N finished trials")
    print(f"{'sampler':<26}{'200':>10}{'1000':>10}")
    for label, by_history in asks.items():
        print(f"{label:<26}" + "".join(f"{by_history[h] * 1000:>10.1f}" for h in ("200", "1000")))


def write(
    out: Path,
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    table: dict[Key, dict[str, float]],
    closed: dict[str, dict[str, float | None]],
    spread: dict[str, dict[str, dict[str, float] | None]],
    asks: dict[str, dict[str, float]],
    headline: float | None,
    wall_s: float,
    versus: dict[str, dict[str, dict[str, float] | None]],
    noise: dict[str, Any],
) -> None:
    cells = [
        {"objective": o, "variant": v, "pruner": p, "k": k, **cell}
        for (o, v, p, k), cell in sorted(table.items())
    ]
    document = {
        "benchmark": "parallel_search",
        "quick": args.quick,
        "suite": args.suite,
        "median_trial_s": MEDIAN_TRIAL_S,
        "wall_s_virtual": WALL_S,
        "default_sampler": describe_default(),
        "environment": environment(),
        "medians": cells,
        "gap_closed_k16": closed,
        "gap_closed_spread": spread,
        "gap_closed_headline": headline,
        "default_minus_optuna_tpe": versus,
        "noise_floor": noise,
        "ask_s": asks,
        "runs": results,
        "wall_s": wall_s,
    }
    out.write_text(json.dumps(document, indent=1, default=str))
    print(f"\nwrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out} ({wall_s:.0f} s)")


def environment() -> dict[str, Any]:
    """What the numbers were measured on (no paths, nothing secret)."""
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "optuna": optuna.__version__,
        "torch": available("gp"),
        "cmaes": available("cmaes"),
    }


def describe_default() -> dict[str, str]:
    """What `sampler = "auto"` builds, per max_in_flight and budget (`make_sampler`'s rule)."""
    found = {}
    for k in KS:
        for n in BUDGETS:
            spec = spec_for(Case("hartmann6", DEFAULT, k, seed=0, n_trials=n))
            sampler: Any = make_sampler(spec)
            distinct = isinstance(sampler, DistinctFromRunning)
            inner = sampler.sampler if distinct else sampler
            model = _model_of(inner)
            found[f"k={k} n_trials={n}"] = f"{model} distinct_from_running={distinct}"
    return found


def _model_of(sampler: Any) -> str:
    if isinstance(sampler, TakingTurns):
        return " + ".join(_model_of(member) for member in sampler.members)
    if isinstance(sampler, optuna.samplers.TPESampler):
        return f"TPE multivariate={sampler._multivariate} constant_liar={sampler._constant_liar}"
    return type(sampler).__name__


if __name__ == "__main__":
    sys.exit(main())
