"""Seeded, noisy objectives that look like hyperparameter landscapes, for `parallel_search`.

Each objective turns one parameter set (and a generator seeded by the study's seed and the
trial's number) into a `Simulated` trial: the value the trial reports (noisy), the value
without noise (what the benchmark scores: a sampler that picks a lucky draw has not found a
better model), how long it runs relative to the median trial, whether it ran out of memory,
and, where the objective has one, its learning curve for the pruners. All are minimised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

Params = Mapping[str, Any]


@dataclass(frozen=True)
class Simulated:
    """What one trial would do on a real cluster."""

    values: tuple[float, ...]
    """The objective values the trial returns (with noise)."""
    true_values: tuple[float, ...]
    """The same without noise: the score of a trial the study picks as its best."""
    cost: float = 1.0
    """Run time relative to a median trial of this objective."""
    oom: bool = False
    curve: tuple[float, ...] = ()
    """Intermediate values, one per epoch (the last one is the returned value)."""


@dataclass(frozen=True)
class Objective:
    """A simulated study: its space (a `[space.*]` table or a define-by-run function)."""

    name: str
    evaluate: Callable[[Params, np.random.Generator], Simulated]
    metrics: tuple[str, ...] = ("value",)
    space: dict[str, dict[str, Any]] = field(default_factory=dict)
    search_space: str | None = None
    """`module:function` of a define-by-run space (the spec's `study.search_space`)."""
    has_curves: bool = False

    @property
    def multi(self) -> bool:
        """Whether the study has more than one objective."""
        return len(self.metrics) > 1


# --- Branin and Hartmann-6: the classic smooth test functions, with noise -----------------


def _branin(params: Params, rng: np.random.Generator) -> Simulated:
    x1, x2 = float(params["x1"]), float(params["x2"])
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    value = (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10
    return Simulated((value + rng.normal(0, 0.5),), (value,))


_H6_A = np.array(
    [
        [10, 3, 17, 3.5, 1.7, 8],
        [0.05, 10, 17, 0.1, 8, 14],
        [3, 3.5, 1.7, 10, 17, 8],
        [17, 8, 0.05, 10, 0.1, 14],
    ]
)
_H6_P = 1e-4 * np.array(
    [
        [1312, 1696, 5569, 124, 8283, 5886],
        [2329, 4135, 8307, 3736, 1004, 9991],
        [2348, 1451, 3522, 2883, 3047, 6650],
        [4047, 8828, 8732, 5743, 1091, 381],
    ]
)
_H6_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])


def _hartmann6(params: Params, rng: np.random.Generator) -> Simulated:
    x = np.array([float(params[f"x{i}"]) for i in range(6)])
    value = float(-np.sum(_H6_ALPHA * np.exp(-np.sum(_H6_A * (x - _H6_P) ** 2, axis=1))))
    return Simulated((value + rng.normal(0, 0.05),), (value,))


# --- a training run: mixed space, an out-of-memory region, cost and a learning curve ------

EPOCHS = 12
_BEST_LR = {"adam": 1e-3, "rmsprop": 5e-4, "sgd": 5e-2}
_LR_WIDTH = {"adam": 0.9, "rmsprop": 0.7, "sgd": 0.45}
"""How far (in decades) the learning rate may stray before it costs much: SGD is best
tuned but the narrowest, so the best region is small."""
_OPTIMIZER_FLOOR = {"adam": 0.02, "rmsprop": 0.035, "sgd": 0.0}
MEMORY_LIMIT = 2**18
"""batch_size x width x depth above this runs out of memory: the biggest models do not fit
at the biggest batches, and big models are where the loss is lowest."""


def _training(params: Params) -> tuple[float, float, bool, float]:
    """Final validation loss, relative cost, OOM, and how fast the curve falls."""
    optimizer, batch = str(params["optimizer"]), int(params["batch_size"])
    width, depth = int(params["width"]), int(params["depth"])
    dropout, lr = float(params["dropout"]), float(params["learning_rate"])
    best_lr = _BEST_LR[optimizer] * (batch / 64) ** (1.0 if optimizer == "sgd" else 0.5)
    stray = math.log10(lr / best_lr) / _LR_WIDTH[optimizer]
    size = width * depth
    underfit = 0.9 / (1 + size / 600)
    overfit = 0.12 * math.log2(1 + size / 2048) * (1 - dropout / 0.7) ** 2
    loss = (
        0.25
        + _OPTIMIZER_FLOOR[optimizer]
        + 0.25 * (1 - math.exp(-(stray**2)))
        + underfit
        + overfit
        + 0.04 * dropout
        + 0.03 * max(0.0, math.log2(batch / 128))  # big batches generalise a little worse
        + (0.6 if stray > 1.6 else 0.0)  # far too high a learning rate diverges
    )
    cost = (size / 1024) ** 0.35 * (64 / batch) ** 0.4
    speed = min(1.0, 10 ** min(0.0, stray)) ** 0.5  # too low a learning rate learns slowly
    return loss, cost, batch * size > MEMORY_LIMIT, speed


def _curve(final: float, speed: float, rng: np.random.Generator) -> tuple[float, ...]:
    start = 2.3
    steps = []
    for epoch in range(1, EPOCHS + 1):
        progress = 1 - math.exp(-4 * speed * epoch / EPOCHS)
        steps.append(start + (final - start) * progress + rng.normal(0, 0.015))
    return tuple(steps)


def _train(params: Params, rng: np.random.Generator) -> Simulated:
    loss, cost, oom, speed = _training(params)
    if oom:
        return Simulated((math.nan,), (math.nan,), cost=0.05, oom=True)
    # What the run reaches in EPOCHS: a slow learning rate has not converged yet.
    reached = 2.3 + (loss - 2.3) * (1 - math.exp(-4 * speed))
    curve = _curve(loss, speed, rng)
    return Simulated((curve[-1],), (reached,), cost=cost, curve=curve)


def _train_two(params: Params, rng: np.random.Generator) -> Simulated:
    """The same run, scored on loss and on its cost (GPU time): a Pareto front."""
    loss, cost, oom, speed = _training(params)
    if oom:
        return Simulated((math.nan, math.nan), (math.nan, math.nan), cost=0.05, oom=True)
    reached = 2.3 + (loss - 2.3) * (1 - math.exp(-4 * speed))
    return Simulated((reached + rng.normal(0, 0.015), cost), (reached, cost), cost=cost)


_TRAIN_SPACE: dict[str, dict[str, Any]] = {
    "learning_rate": {"type": "float", "low": 1e-5, "high": 1.0, "log": True},
    "batch_size": {"type": "categorical", "choices": [16, 32, 64, 128, 256, 512]},
    "width": {"type": "int", "low": 16, "high": 2048, "log": True},
    "depth": {"type": "int", "low": 1, "high": 8},
    "dropout": {"type": "float", "low": 0.0, "high": 0.6},
    "optimizer": {"type": "categorical", "choices": ["adam", "rmsprop", "sgd"]},
}


# --- a conditional space (define-by-run): each model family has its own params ------------


def conditional_space(trial: optuna.Trial) -> None:
    """The spec's `study.search_space`: which params exist depends on the model family."""
    model = trial.suggest_categorical("model", ["linear", "mlp", "cnn"])
    trial.suggest_float("learning_rate", 1e-5, 1e-1, log=True)
    if model == "linear":
        trial.suggest_float("l2", 1e-6, 1.0, log=True)
    elif model == "mlp":
        trial.suggest_int("units", 8, 1024, log=True)
        trial.suggest_int("layers", 1, 4)
        trial.suggest_float("mlp_dropout", 0.0, 0.5)
    else:
        trial.suggest_int("filters", 8, 256, log=True)
        trial.suggest_categorical("kernel", [3, 5, 7])
        trial.suggest_categorical("pool", ["max", "avg"])
        trial.suggest_float("cnn_dropout", 0.0, 0.5)


def _decades(value: float, best: float) -> float:
    return math.log10(value / best)


def _conditional(params: Params, rng: np.random.Generator) -> Simulated:
    model, lr = str(params["model"]), float(params["learning_rate"])
    if model == "linear":  # easy to tune, never very good
        value = 0.55 + 0.02 * _decades(float(params["l2"]), 1e-3) ** 2
        value += 0.03 * _decades(lr, 3e-3) ** 2
    elif model == "mlp":
        units, layers = int(params["units"]), int(params["layers"])
        value = 0.32 + 0.03 * _decades(units, 256) ** 2 + 0.02 * (layers - 2) ** 2
        value += 0.08 * (float(params["mlp_dropout"]) - 0.2) ** 2
        value += 0.05 * _decades(lr, 1e-3) ** 2
    else:  # the best family, but only where several params are right together
        filters = int(params["filters"])
        kernel_ok = {3: 0.0, 5: 0.03, 7: 0.09}[int(params["kernel"])]
        value = 0.2 + 0.06 * _decades(filters, 64) ** 2 + kernel_ok
        value += 0.04 if params["pool"] == "avg" else 0.0
        value += 0.3 * (float(params["cnn_dropout"]) - 0.3) ** 2
        value += 0.12 * _decades(lr, 3e-4) ** 2
    return Simulated((value + rng.normal(0, 0.01),), (value,))


# --- other shapes: what the rule was checked on beyond the five above (issue 29) -----------
# Separable, many-valleyed, higher-dimensional and all-categorical landscapes, where a joint
# model and a per-parameter one part ways. Not in the default run: `--objectives` names them.


def _box(low: float, high: float, dims: int) -> dict[str, dict[str, Any]]:
    return {f"x{i}": {"type": "float", "low": low, "high": high} for i in range(dims)}


def _vector(params: Params, dims: int) -> np.ndarray:
    return np.array([float(params[f"x{i}"]) for i in range(dims)])


def _levy8(params: Params, rng: np.random.Generator) -> Simulated:
    w = 1 + (_vector(params, 8) - 1) / 4
    value = (
        math.sin(math.pi * w[0]) ** 2
        + float(np.sum((w[:-1] - 1) ** 2 * (1 + 10 * np.sin(math.pi * w[:-1] + 1) ** 2)))
        + (w[-1] - 1) ** 2 * (1 + math.sin(2 * math.pi * w[-1]) ** 2)
    )
    return Simulated((value + rng.normal(0, 0.1),), (value,))


def _styblinski6(params: Params, rng: np.random.Generator) -> Simulated:
    x = _vector(params, 6)
    value = float(np.sum(x**4 - 16 * x**2 + 5 * x)) / 2 + 39.16617 * 6  # 0 at the optimum
    return Simulated((value + rng.normal(0, 0.5),), (value,))


def _ackley6(params: Params, rng: np.random.Generator) -> Simulated:
    x = _vector(params, 6)
    value = (
        -20 * math.exp(-0.2 * math.sqrt(float(np.mean(x**2))))
        - math.exp(float(np.mean(np.cos(2 * math.pi * x))))
        + 20
        + math.e
    )
    return Simulated((value + rng.normal(0, 0.05),), (value,))


def _rosenbrock6(params: Params, rng: np.random.Generator) -> Simulated:
    x = _vector(params, 6)
    value = math.log1p(float(np.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)))
    return Simulated((value + rng.normal(0, 0.05),), (value,))


_SPHERE_WEIGHTS = np.linspace(1, 10, 10)


def _sphere10(params: Params, rng: np.random.Generator) -> Simulated:
    value = float(np.sum(_SPHERE_WEIGHTS * (_vector(params, 10) - 0.3) ** 2))
    return Simulated((value + rng.normal(0, 0.01),), (value,))


_LANDSCAPE = np.random.default_rng(1234)  # a fixed landscape, the same in every study
_CHOICES = {"a": 3, "b": 4, "c": 5, "d": 6}
_MAIN_EFFECT = {name: _LANDSCAPE.uniform(0, 0.3, n) for name, n in _CHOICES.items()}
_A_WITH_B = _LANDSCAPE.uniform(0, 0.2, (3, 4))


def _categories(params: Params, rng: np.random.Generator) -> Simulated:
    value = sum(_MAIN_EFFECT[name][int(params[name])] for name in _CHOICES)
    value += _A_WITH_B[int(params["a"]), int(params["b"])]
    value += 0.1 * (math.log10(float(params["lr"])) + 3) ** 2
    value += 0.02 * abs(int(params["layers"]) - 3)
    return Simulated((value + rng.normal(0, 0.01),), (float(value),))


OTHER_SHAPES: dict[str, Objective] = {
    "levy8": Objective("levy8", _levy8, space=_box(-10.0, 10.0, 8)),
    "styblinski6": Objective("styblinski6", _styblinski6, space=_box(-5.0, 5.0, 6)),
    "ackley6": Objective("ackley6", _ackley6, space=_box(-5.0, 10.0, 6)),
    "rosenbrock6": Objective("rosenbrock6", _rosenbrock6, space=_box(-2.0, 2.0, 6)),
    "sphere10": Objective("sphere10", _sphere10, space=_box(0.0, 1.0, 10)),
    "categories": Objective(
        "categories",
        _categories,
        space={
            **{
                name: {"type": "categorical", "choices": list(range(n))}
                for name, n in _CHOICES.items()
            },
            "lr": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
            "layers": {"type": "int", "low": 1, "high": 8},
        },
    ),
}


OBJECTIVES: dict[str, Objective] = {
    "branin": Objective(
        "branin",
        _branin,
        space={
            "x1": {"type": "float", "low": -5.0, "high": 10.0},
            "x2": {"type": "float", "low": 0.0, "high": 15.0},
        },
    ),
    "hartmann6": Objective(
        "hartmann6",
        _hartmann6,
        space={f"x{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(6)},
    ),
    "train": Objective("train", _train, space=_TRAIN_SPACE, has_curves=True),
    "conditional": Objective(
        "conditional", _conditional, search_space="benchmarks.search_objectives:conditional_space"
    ),
    "train-2obj": Objective("train-2obj", _train_two, metrics=("loss", "cost"), space=_TRAIN_SPACE),
}
DEFAULT_RUN = tuple(OBJECTIVES)
"""The objectives a run without `--objectives` takes: the project's five."""
OBJECTIVES.update(OTHER_SHAPES)


def hypervolume_2d(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """The area two minimised objectives' points dominate up to `reference`."""
    inside = sorted(p for p in points if p[0] < reference[0] and p[1] < reference[1])
    area, best_second = 0.0, reference[1]
    for first, second in inside:
        if second < best_second:
            area += (reference[0] - first) * (best_second - second)
            best_second = second
    return area
