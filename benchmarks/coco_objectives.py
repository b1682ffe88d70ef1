"""Objectives the project did not write, for `parallel_search --suite coco` (issue 40).

COCO's `bbob` (noiseless continuous) and `bbob-mixint` (some variables integer) suites, from
the `coco-experiment` package (`cocoex`, offline), instance 1 of each function, and spaces
with categorical and conditional parameters built on them: a categorical that selects among
bbob landscapes, one that shifts a landscape, and a define-by-run space whose branches have
parameters of their own. The project's `train` (log ints and categoricals, a learning curve)
runs beside them (`suite_names`).

A trial's score is the function's value, not its regret: every comparison the benchmark makes
(differences of medians, shares of a gap) is the same with the optimum subtracted, and COCO
keeps the optimum behind an interface that writes files. No noise: observed = true.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import optuna

from benchmarks.search_objectives import Objective, Params, Simulated

BBOB_FUNCTIONS = {8: "rosenbrock", 15: "rastrigin", 21: "gallagher"}
"""Three of bbob's five groups: moderately conditioned, multi-modal with structure, and
multi-modal without (Gallagher's 101 peaks); a wide spread at a few dimensions."""
BBOB_DIMS = (2, 5)
HELD_OUT_2D = {
    1: "sphere",
    3: "separable rastrigin",
    6: "attractive sector",
    10: "ellipsoid",
    17: "schaffer f7",
    20: "schwefel",
    24: "lunacek bi-rastrigin",
}
"""2-D bbob landscapes outside the suite, one or two from each of bbob's five groups: a rule
shaped on the suite's 2-D rows is checked on these (`--objectives bbob-f1-d2 ...`), not in
`--suite coco`."""
MIXINT_FUNCTIONS = {8: "rosenbrock", 15: "rastrigin"}
MIXINT_DIM = 5
"""The smallest mixint dimension: four integers (ranges 2, 4, 8, 16 values) and a float."""


@functools.cache
def _problem(suite: str, function: int, dimension: int) -> Any:
    """A COCO problem, built once per process (a suite is slow to open)."""
    import cocoex

    chosen = f"function_indices:{function} dimensions:{dimension} instance_indices:1"
    opened = cocoex.Suite(suite, "", chosen)
    return opened[0]


def _space_of(suite: str, function: int, dimension: int) -> dict[str, dict[str, Any]]:
    """The problem's box; COCO's first `number_of_integer_variables` variables are ints."""
    problem = _problem(suite, function, dimension)
    ints = problem.number_of_integer_variables
    space: dict[str, dict[str, Any]] = {}
    for i, (low, high) in enumerate(zip(problem.lower_bounds, problem.upper_bounds, strict=True)):
        if i < ints:
            space[f"x{i}"] = {"type": "int", "low": int(low), "high": int(high)}
        else:
            space[f"x{i}"] = {"type": "float", "low": float(low), "high": float(high)}
    return space


def _coco(suite: str, function: int, dimension: int) -> Objective:
    def evaluate(params: Params, rng: np.random.Generator) -> Simulated:
        x = np.array([float(params[f"x{i}"]) for i in range(dimension)])
        value = float(_problem(suite, function, dimension)(x))
        return Simulated((value,), (value,))

    name = f"{suite}-f{function}-d{dimension}"
    return Objective(name, evaluate, space=_space_of(suite, function, dimension))


# --- categorical and conditional spaces on bbob landscapes --------------------------------

_LANDSCAPES = (21, 15, 8, 3)
"""The 2-D bbob function each choice of `cat-select` picks."""
_SELECT_OFFSET = (0.0, 8.0, 3.0, 15.0)
"""Added to each choice's landscape: one choice holds the best region, others come close."""


def _select(params: Params, rng: np.random.Generator) -> Simulated:
    """A 4-way categorical picks which 2-D bbob landscape the two floats move on."""
    choice = int(str(params["landscape"])[1:])
    function = _LANDSCAPES[choice]
    x = np.array([float(params["x0"]), float(params["x1"])])
    value = _lifted(function, x) + _SELECT_OFFSET[choice] / 10
    return Simulated((value,), (value,))


def _lifted(function: int, x: np.ndarray) -> float:
    """bbob's value at `x` on a log scale from about its optimum, so that landscapes with
    different optima (COCO draws them per function) can be put side by side."""
    value = float(_problem("bbob", function, len(x))(x)) - _floor(function, len(x))
    return math.log1p(max(value, 0.0))


@functools.cache
def _floor(function: int, dimension: int) -> float:
    """About the landscape's optimum: the least of 20,000 seeded uniform points, less 1."""
    problem = _problem("bbob", function, dimension)
    points = np.random.default_rng(0).uniform(-5, 5, (20_000, dimension))
    return float(min(problem(x) for x in points)) - 1.0


_SHIFTS = ((0.0, 0.0), (2.5, -2.0), (-3.0, 1.5), (1.0, 3.5))
_SHIFT_COST = (0.6, 0.0, 0.3, 0.9)


def _shift(params: Params, rng: np.random.Generator) -> Simulated:
    """A 4-way categorical moves Gallagher's 2-D landscape and adds a cost of its own: the
    best floats depend on the choice, so a model must learn them together."""
    choice = int(str(params["shift"])[1:])
    dx, dy = _SHIFTS[choice]
    x = np.array([float(params["x0"]) - dx, float(params["x1"]) - dy]).clip(-5, 5)
    value = _lifted(21, x) + _SHIFT_COST[choice]
    return Simulated((value,), (value,))


_RAW_OFFSET = (0.0, 3.0, 1.0, 5.0)


def _raw(params: Params, rng: np.random.Generator) -> Simulated:
    """`cat-select`'s four landscapes on their own scale (no log), offsets in the same units:
    the choice's effect is as large as the floats'. Not in the suite (checked after it)."""
    choice = int(str(params["choice"])[1:])
    function = _LANDSCAPES[choice]
    x = np.array([float(params["x0"]), float(params["x1"])])
    value = float(_problem("bbob", function, 2)(x)) - _floor(function, 2) + _RAW_OFFSET[choice]
    return Simulated((value,), (value,))


def _categorical_2d(name: str) -> dict[str, dict[str, Any]]:
    return {
        name: {"type": "categorical", "choices": ["c0", "c1", "c2", "c3"]},
        "x0": {"type": "float", "low": -5.0, "high": 5.0},
        "x1": {"type": "float", "low": -5.0, "high": 5.0},
    }


def branching_space(trial: optuna.Trial) -> None:
    """`study.search_space` of `cat-branch`: which parameters exist depends on `branch`."""
    branch = trial.suggest_categorical("branch", ["rastrigin", "rosenbrock", "gallagher"])
    if branch == "rastrigin":
        for i in range(3):
            trial.suggest_float(f"r{i}", -5.0, 5.0)
    elif branch == "rosenbrock":
        trial.suggest_float("s0", -5.0, 5.0)
        trial.suggest_int("s1", 1, 1024, log=True)
    else:
        trial.suggest_float("g0", -5.0, 5.0)
        trial.suggest_float("g1", -5.0, 5.0)
        trial.suggest_categorical("g2", [-4.0, -1.0, 0.5, 3.0])


def _branch(params: Params, rng: np.random.Generator) -> Simulated:
    branch = str(params["branch"])
    if branch == "rastrigin":
        x, function, offset = [float(params[f"r{i}"]) for i in range(3)], 15, 0.0
    elif branch == "rosenbrock":  # the int on a log scale: its useful values are few
        x = [float(params["s0"]), math.log2(float(params["s1"])) - 5.0]
        function, offset = 8, 0.5
    else:
        x, function = [float(params["g0"]), float(params["g1"]), float(params["g2"])], 21
        offset = 0.2
    value = _lifted(function, np.array(x)) + offset
    return Simulated((value,), (value,))


def _suite() -> dict[str, Objective]:
    found: dict[str, Objective] = {}
    for dimension in BBOB_DIMS:
        for function in BBOB_FUNCTIONS:
            objective = _coco("bbob", function, dimension)
            found[objective.name] = objective
    for function in HELD_OUT_2D:
        objective = _coco("bbob", function, 2)
        found[objective.name] = objective
    for function in MIXINT_FUNCTIONS:
        objective = _coco("bbob-mixint", function, MIXINT_DIM)
        found[objective.name] = objective
    found["cat-select"] = Objective("cat-select", _select, space=_categorical_2d("landscape"))
    found["cat-shift"] = Objective("cat-shift", _shift, space=_categorical_2d("shift"))
    found["cat-raw"] = Objective("cat-raw", _raw, space=_categorical_2d("choice"))
    found["cat-branch"] = Objective(
        "cat-branch", _branch, search_space="benchmarks.coco_objectives:branching_space"
    )
    return found


def coco_objectives() -> dict[str, Objective]:
    """The tuning suite's and the held-out part's objectives (cocoex imported here: only a
    run that asks for them)."""
    return {**_suite(), **_held_out()}


SUITE_FROM_PROJECT = ("train",)
"""The project's objective that runs with the suite: log ints, categoricals, a curve."""


def suite_names() -> tuple[str, ...]:
    """What `--suite coco` runs, named without opening COCO."""
    bbob = [f"bbob-f{f}-d{d}" for d in BBOB_DIMS for f in BBOB_FUNCTIONS]
    mixint = [f"bbob-mixint-f{f}-d{MIXINT_DIM}" for f in MIXINT_FUNCTIONS]
    return (*bbob, *mixint, "cat-select", "cat-shift", "cat-branch", *SUITE_FROM_PROJECT)


# --- the held-out part: chosen before any tuning, never tuned on -------------------------

HELD_OUT_BBOB = {
    1: "sphere", 2: "separable ellipsoid", 12: "bent cigar", 16: "weierstrass",
    20: "schwefel", 23: "katsuura",
}  # fmt: skip
"""bbob functions outside the tuning suite, from four of its five groups (separable,
ill-conditioned, multi-modal with and without structure), at `HELD_OUT_DIMS`."""
HELD_OUT_MIXINT = {1: "sphere", 20: "schwefel"}
HELD_OUT_DIMS = (5, 10)
NOISE_SD = 0.05
"""The noise on `noisy-rastrigin-d5`'s observed value, on its log scale (`_lifted`)."""


def _noisy_rastrigin(params: Params, rng: np.random.Generator) -> Simulated:
    """bbob's Rastrigin at 5-D, observed with noise: the study sees the noisy value, its best
    trial is scored without it."""
    true = _lifted(15, np.array([float(params[f"x{i}"]) for i in range(5)]))
    return Simulated((true + float(rng.normal(0, NOISE_SD)),), (true,))


_LOG_INT_SPACE: dict[str, dict[str, Any]] = {
    "lr": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
    "batch": {"type": "int", "low": 8, "high": 1024, "log": True},
    "width": {"type": "int", "low": 16, "high": 512, "step": 16},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
    "layers": {"type": "int", "low": 1, "high": 8},
}


def _log_int(params: Params, rng: np.random.Generator) -> Simulated:
    """Log-scale floats and ints and stepped ints, mapped onto bbob's 5-D ellipsoid (f10):
    the best values sit inside the ranges, off their centres."""
    x = np.array(
        [
            math.log10(float(params["lr"])) + 2.5,  # -5..0 -> -2.5..2.5
            math.log2(float(params["batch"])) - 6.5,  # 3..10 -> -3.5..3.5
            (float(params["width"]) - 264) / 62,  # 16..512 -> -4..4
            float(params["dropout"]) * 16 - 4,  # 0..0.5 -> -4..4
            float(params["layers"]) - 4.5,  # 1..8 -> -3.5..3.5
        ]
    )
    value = _lifted(10, x)
    return Simulated((value,), (value,))


def optimizer_space(trial: optuna.Trial) -> None:
    """`study.search_space` of `cond-optimizer`: each optimiser has parameters of its own."""
    optimizer = trial.suggest_categorical("optimizer", ["sgd", "adam", "rmsprop"])
    trial.suggest_float("lr", 1e-5, 1.0, log=True)
    if optimizer == "sgd":
        trial.suggest_float("momentum", 0.0, 0.99)
        trial.suggest_categorical("nesterov", [False, True])
    elif optimizer == "adam":
        trial.suggest_float("beta2", 0.9, 0.9999, log=True)
        trial.suggest_int("warmup", 0, 2000, step=100)
    else:
        trial.suggest_float("alpha", 0.8, 0.999)


_OPTIMIZER_OFFSET = {"sgd": 0.3, "adam": 0.0, "rmsprop": 0.5}


def _optimizer(params: Params, rng: np.random.Generator) -> Simulated:
    """A landscape per optimiser (bbob's Rosenbrock, Gallagher, sphere-like Rastrigin), each
    over the shared `lr` and its own parameters; `adam` holds the best region."""
    optimizer, lr = str(params["optimizer"]), math.log10(float(params["lr"])) + 2.5
    if optimizer == "sgd":
        momentum = float(params["momentum"]) * 8 - 4
        x, function = [lr, momentum, 1.0 if params["nesterov"] else -1.0], 8
    elif optimizer == "adam":
        beta = -math.log10(1 - float(params["beta2"])) * 2 - 5  # 1..4 -> -3..3
        x, function = [lr, beta, float(params["warmup"]) / 250 - 4], 21
    else:
        x, function = [lr, float(params["alpha"]) * 40 - 36], 15
    value = _lifted(function, np.array(x)) + _OPTIMIZER_OFFSET[optimizer]
    return Simulated((value,), (value,))


def _held_out() -> dict[str, Objective]:
    found: dict[str, Objective] = {}
    for dimension in HELD_OUT_DIMS:
        for function in HELD_OUT_BBOB:
            objective = _coco("bbob", function, dimension)
            found[objective.name] = objective
        for function in HELD_OUT_MIXINT:
            objective = _coco("bbob-mixint", function, dimension)
            found[objective.name] = objective
    noisy = {f"x{i}": {"type": "float", "low": -5.0, "high": 5.0} for i in range(5)}
    found["noisy-rastrigin-d5"] = Objective("noisy-rastrigin-d5", _noisy_rastrigin, space=noisy)
    found["log-int"] = Objective("log-int", _log_int, space=_LOG_INT_SPACE)
    found["cond-optimizer"] = Objective(
        "cond-optimizer", _optimizer, search_space="benchmarks.coco_objectives:optimizer_space"
    )
    return found


HELD_OUT = (
    *(f"bbob-f{f}-d{d}" for d in HELD_OUT_DIMS for f in HELD_OUT_BBOB),
    *(f"bbob-mixint-f{f}-d{d}" for d in HELD_OUT_DIMS for f in HELD_OUT_MIXINT),
    "cat-raw",
    "noisy-rastrigin-d5",
    "log-int",
    "cond-optimizer",
)
"""The held-out part, fixed before the default was chosen (2026-12-06) and never tuned on:
what `--suite heldout` runs and every claim about `auto` is reported on. The tuning part is
`suite_names()` (`--suite coco`), the project's own objectives and `HELD_OUT_2D`, on which
earlier rules were shaped."""
