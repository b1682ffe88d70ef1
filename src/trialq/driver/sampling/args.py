"""`[study.sampler_args]` held to what the sampler takes, before the study exists.

Optuna's samplers check few of their arguments: `n_startup_trials = -1` or `2.5`, `gamma = 3`
(TPE's takes a function), `n_ei_candidates = 0` were taken and failed at the first ask or
fit, after the study existed, or silently changed the search. Each value
is checked against the type the sampler's signature declares and, for counts and weights,
the range it makes sense in; arguments a spec cannot give (a function, a sampler object)
are refused by name. The samplers' own checks (a seed's range, NSGA-II's probabilities) run
after these, when the sampler is built.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from trialq.errors import SpecError
from trialq.limits import INT32_MAX

AT_LEAST: Mapping[str, float] = {
    "n_startup_trials": 0,
    "n_ei_candidates": 1,
    "popsize": 1,
    "inc_popsize": 1,
    "population_size": 2,
}
"""Counts, and the least each takes (at most `INT32_MAX`)."""
ABOVE_ZERO = frozenset({"prior_weight", "sigma0"})
"""Floats that must be past 0."""
_SCALARS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "None": lambda v: v is None,
}
_TABLES = ("dict[", "Mapping[", "Sequence[", "list[")
"""Annotations whose values a TOML table or array gives; the sampler checks what is in it."""


def check_sampler_args(
    factory: Callable[..., Any],
    args: Mapping[str, Any],
    key: str,
    at_least: Mapping[str, float] = AT_LEAST,
) -> None:
    """Raise `SpecError` ("`key`.NAME: ...") for the first argument the factory's signature
    does not take, takes as another type, or that is past its range (`at_least`: the
    counts of the factory's family, and the least each takes)."""
    parameters = _parameters(factory)
    for name, value in args.items():
        annotation = parameters.get(name)
        if annotation is None:
            continue  # unknown names: the factory's own TypeError says so
        problem = _type_problem(annotation, value) or _range_problem(name, value, at_least)
        if problem is not None:
            raise SpecError(f"{key}.{name}: {problem}")


def _parameters(factory: Callable[..., Any]) -> dict[str, str]:
    """Each keyword parameter's annotation as text, following a subclass that takes
    `**args` to the class it hands them to."""
    target = factory
    while True:
        signature = inspect.signature(target)
        if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()) and isinstance(
            target, type
        ):
            target = target.__mro__[1]
            continue
        return {
            name: _text(p.annotation)
            for name, p in signature.parameters.items()
            if p.kind is not p.VAR_KEYWORD and p.annotation is not inspect.Parameter.empty
        }


def _text(annotation: Any) -> str:
    """`int | None` as text, whether the module that wrote it postponed annotations or not."""
    if isinstance(annotation, str):
        return annotation
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _type_problem(annotation: str, value: Any) -> str | None:
    kinds = [part.strip() for part in annotation.split("|")]
    if any(kind.startswith(_TABLES) for kind in kinds):
        return None
    known = [kind for kind in kinds if kind in _SCALARS]
    if not set(known) - {"None"}:
        return f"takes a {annotation}, which a spec cannot give: leave it out"
    if any(_SCALARS[kind](value) for kind in known):
        return None
    wanted = " or ".join(kind for kind in known if kind != "None")
    return f"{value!r} is not {'an' if wanted.startswith('int') else 'a'} {wanted}"


def _range_problem(name: str, value: Any, at_least: Mapping[str, float]) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    least = at_least.get(name)
    if least is not None and not least <= value <= INT32_MAX:
        return f"{value!r} is out of range: {least:g} to {INT32_MAX}"
    if name in ABOVE_ZERO and value <= 0:
        return f"{value!r} must be above 0"
    return None
