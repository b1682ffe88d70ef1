"""A sampler that never proposes the parameters of a trial still running.

With many trials in flight, TPE's constant liar only makes a running trial's parameters less
likely; on a discrete space it still proposes some of them again, and a duplicate of a
running trial teaches the study nothing and costs a GPU for a whole trial (docs/spec.md,
"The default sampler"). This wrapper draws the whole parameter set at once (as
`sample_relative`, so Optuna takes it for every parameter), and draws again while it equals
a running trial's: first from the wrapped sampler, then at random, and gives up only when
every draw collides (a space smaller than the trials in flight).

It also starts the study space-filling: until `start` trials have finished, each ask gets
the next point of a seeded Halton sequence (`HaltonStart`) instead of the wrapped sampler's
random start (issue 29; `study.space_filling_start` says how many and why).

It needs the whole space up front, so it wraps only a spec's declared `[space]`; a
define-by-run space (`study.search_space`) gets the wrapped sampler alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from trialq.driver.sampling.history import TrialIndex

DRAWS = 16  # from each sampler; a collision past the first draw is already rare


class DistinctFromRunning(BaseSampler):
    def __init__(
        self,
        sampler: BaseSampler,
        space: dict[str, BaseDistribution],
        seed: int | None = None,
        start: int = 0,
    ) -> None:
        self.sampler = sampler
        self.space = space
        self.start = start
        """Until this many trials have finished (complete or pruned), draw space-filling
        points (`HaltonStart`) instead of the wrapped sampler's own random start."""
        self._random = RandomSampler(seed=seed)
        self._halton = HaltonStart(space, seed)
        self._index: TrialIndex | None = None
        self._index_of = -1  # the study id the index is of

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        index = self._indexed(study)
        running = [t.params for t in index.running() if t.number != trial.number and t.params]
        params: dict[str, Any] = {}
        if self.start and self._starting(study):
            params = self._halton.point(trial.number)
            if params not in running:
                return params
        for sampler in (self.sampler, self._random):
            for _ in range(DRAWS):
                params = _draw(sampler, study, trial, search_space)
                if params not in running:
                    return params
        return params  # every draw is running already: the space is smaller than the flight

    def _starting(self, study: optuna.Study) -> bool:
        """Whether fewer than `start` trials have finished (complete or pruned)."""
        return self._indexed(study).learnt < self.start

    def _indexed(self, study: optuna.Study) -> TrialIndex:
        """The study's trials as they are now, learnt from those that changed (issue 42: a
        scan of the whole study an ask cost more the larger it grew)."""
        if self._index is None or self._index_of != study._study_id:
            self._index = TrialIndex(study.directions, best=0, recent=0)
            self._index_of = study._study_id
        self._index.refresh(study)
        return self._index

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        # Only for a parameter outside the declared space (not from a spec).
        return self.sampler.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.sampler.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self.sampler.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.sampler.reseed_rng()
        self._random.reseed_rng()


def _draw(
    sampler: BaseSampler,
    study: optuna.Study,
    trial: FrozenTrial,
    space: dict[str, BaseDistribution],
) -> dict[str, Any]:
    """One whole parameter set from `sampler`: its relative part, the rest one by one."""
    relative_space = sampler.infer_relative_search_space(study, trial)
    params = dict(sampler.sample_relative(study, trial, relative_space))
    for name, distribution in space.items():
        if name not in params:
            params[name] = sampler.sample_independent(study, trial, name, distribution)
    return {name: params[name] for name in space}


PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71)


class HaltonStart:
    """Space-filling points for the start of a study: the Halton sequence (a prime base per
    parameter) shifted at random, mod 1 (a Cranley-Patterson rotation, seeded), mapped onto
    each distribution. Point `i` depends on `i` alone, so trials asked in any order and any
    number at once still cover the space evenly, where independent random draws clump. NumPy
    only (Optuna's QMCSampler needs SciPy, which trialq does not require). Past the 20th
    parameter, plain random values."""

    def __init__(self, space: dict[str, BaseDistribution], seed: int | None) -> None:
        self.space = space
        self._rng = np.random.default_rng(seed)
        self._shift = self._rng.random(len(PRIMES))

    def point(self, index: int) -> dict[str, Any]:
        params = {}
        for d, (name, distribution) in enumerate(self.space.items()):
            if d < len(PRIMES):
                u = (_radical_inverse(index + 1, PRIMES[d]) + self._shift[d]) % 1.0
            else:
                u = float(self._rng.random())
            params[name] = _value(distribution, u)
        return params


def _radical_inverse(index: int, base: int) -> float:
    inverse, scale = 0.0, 1.0 / base
    while index:
        index, digit = divmod(index, base)
        inverse += digit * scale
        scale /= base
    return inverse


def _value(distribution: BaseDistribution, u: float) -> Any:
    """The value at quantile `u` of a uniform (or log-uniform) draw from `distribution`."""
    if isinstance(distribution, CategoricalDistribution):
        choices = distribution.choices
        return choices[min(int(u * len(choices)), len(choices) - 1)]
    if isinstance(distribution, (FloatDistribution, IntDistribution)):
        low, high, step = float(distribution.low), float(distribution.high), distribution.step
        integer = isinstance(distribution, IntDistribution)
        if distribution.log:
            if integer:  # as Optuna draws a log int: over [low - 0.5, high + 0.5], rounded
                low, high = low - 0.5, high + 0.5
            value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
            if integer:
                return int(min(max(round(value), distribution.low), distribution.high))
            return min(max(value, low), high)
        if step is None:
            return low + u * (high - low)
        count = round((high - low) / step) + 1
        value = low + min(int(u * count), count - 1) * step
        return round(value) if integer else min(value, high)  # 0.1 * 6: 0.600...01
    raise TypeError(f"no space-filling start for {distribution!r}")
