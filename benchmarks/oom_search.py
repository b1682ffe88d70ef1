"""How much `oom_as_constraint` keeps a sampler away from parameter sets that do not fit.

    python -m benchmarks.oom_search [--seeds N] [--trials N]

A simulated study of two params (width, depth) in [0, 1], maximising width x depth, where
every trial with width x depth > 0.3 runs out of memory. The trials run in this process (no
workers: the sampler's choices are what is measured), but each OOM trial is told exactly as
trialq's driver tells it (`trialq.driver.sampling.oom_constraint`): FAIL without the option,
and with it the state, stand-in values and constraint the sampler reads. Prints, for TPE,
NSGA-II and GP (where torch and scipy are installed), the share of OOM trials in the second
half of each study, without and with the option, per seed and on average; writes
JSON under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from benchmarks.overhead import RESULTS, ROOT, environment
from trialq.driver.sampling.gp import gp_and_tpe
from trialq.driver.sampling.oom_constraint import OOM_CONSTRAINT, oom_telling, sampler_kind
from trialq.driver.sampling.rule import gp_runs_here

SPACE = {
    "width": optuna.distributions.FloatDistribution(0, 1),
    "depth": optuna.distributions.FloatDistribution(0, 1),
}
FITS_UP_TO = 0.3
SAMPLERS: dict[str, tuple[str, dict[str, Any]]] = {
    "tpe": ("tpe", {"n_startup_trials": 10}),
    "nsga2 (defaults, population 6)": ("nsga2", {"population_size": 6}),
    "nsga2 (population 6, mutation_prob 0.1)": (
        "nsga2",
        {"population_size": 6, "mutation_prob": 0.1},
    ),
    "gp (needs torch, scipy)": ("gp", {"n_startup_trials": 10}),
    "gp+tpe, taking turns (auto at 50 trials)": ("gp+tpe", {}),
}


def make_sampler(name: str, args: dict[str, Any], seed: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **args)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, **args)
    if name == "gp+tpe":
        return gp_and_tpe(seed=seed, **args)
    return optuna.samplers.NSGAIISampler(seed=seed, **args)


def oom_share(sampler: str, args: dict[str, Any], seed: int, trials: int, on: bool) -> float:
    """The share of OOM trials among the second half of one seeded study."""
    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, args, seed))
    second_half_ooms, seen = 0, []
    for number in range(trials):
        trial = study.ask(SPACE)
        area = trial.params["width"] * trial.params["depth"]
        if area <= FITS_UP_TO:
            study.tell(trial, area)
            seen.append((area,))
            continue
        second_half_ooms += number >= trials // 2
        told = oom_telling(sampler_kind(study.sampler), ["maximize"], seen) if on else None
        if told is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            if told.constrained:
                trial.set_constraint(OOM_CONSTRAINT, 1.0)
            values = told.values if told.state is TrialState.COMPLETE else None
            study.tell(trial, values=values, state=told.state)
    return second_half_ooms / (trials - trials // 2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.oom_search", description=__doc__)
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    rows = []
    for label, (sampler, sampler_args) in SAMPLERS.items():
        if sampler.startswith("gp") and not gp_runs_here():
            continue
        without, with_option = [], []
        for seed in range(args.seeds):
            without.append(oom_share(sampler, sampler_args, seed, args.trials, on=False))
            with_option.append(oom_share(sampler, sampler_args, seed, args.trials, on=True))
        rows.append(
            {
                "sampler": label,
                "without_mean": statistics.mean(without),
                "with_mean": statistics.mean(with_option),
                "without_by_seed": without,
                "with_by_seed": with_option,
            }
        )
    half = f"{args.trials // 2}-{args.trials - 1}"
    print(f"OOM share of trials {half}, {args.seeds} seeds (mean; per seed without/with)")
    print(f"{'sampler':<42} {'without':>8} {'with':>6}  per seed")
    for row in rows:
        pairs = zip(row["without_by_seed"], row["with_by_seed"], strict=True)
        seeds = " ".join(f"{a:.0%}/{b:.0%}" for a, b in pairs)
        print(f"{row['sampler']:<42} {row['without_mean']:>8.0%} {row['with_mean']:>6.0%}  {seeds}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"oom_search-{time.strftime('%Y%m%d-%H%M%S')}.json"
    result = {"benchmark": "oom_search", "trials": args.trials, "fits_up_to": FITS_UP_TO,
              "environment": environment(), "rows": rows}  # fmt: skip
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
