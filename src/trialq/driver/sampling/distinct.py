"""A sampler that never proposes the parameters of a trial still running.

With many trials in flight, TPE's constant liar only makes a running trial's parameters less
likely; on a discrete space it still proposes some of them again, and a duplicate of a
running trial teaches the study nothing and costs a GPU for a whole trial (docs/spec.md,
"The default sampler"). This wrapper draws the whole parameter set at once (as
`sample_relative`, so Optuna takes it for every parameter), and draws again while it equals
a running trial's: first from the wrapped sampler, then at random, and gives up only when
every draw collides (a space smaller than the trials in flight). A first draw that collides
with no running trial is returned as it is: on a continuous space the study is the wrapped
sampler's, trial for trial (tests/unit/test_sampler_default.py holds it to that).

It needs the whole space up front, so it wraps only a spec's declared `[space]`; a
define-by-run space (`study.search_space`) gets the wrapped sampler alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
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
    ) -> None:
        self.sampler = sampler
        self.space = space
        self._random = RandomSampler(seed=seed)
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
        for sampler in (self.sampler, self._random):
            for _ in range(DRAWS):
                params = _draw(sampler, study, trial, search_space)
                if params not in running:
                    return params
        return params  # every draw is running already: the space is smaller than the flight

    def _indexed(self, study: optuna.Study) -> TrialIndex:
        """The study's trials as they are now, learnt from those that changed (a
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
