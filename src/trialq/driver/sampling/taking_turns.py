"""`TakingTurns`: samplers that take turns over one study, a trial each.

Why (`benchmarks.parallel_search`, 50 trials, 16 in flight, gap closed against
Optuna 4's TPE): Optuna's GP sampler models how parameters interact and counts the running
trials, and won most where they do (Branin, Hartmann-6, the training run, a categorical
space); on separable, many-valleyed landscapes (Styblinski-Tang, Levy-8, a 10-D quadratic)
independent TPE, which models each parameter apart, won and GP fell far behind it (Levy-8:
-5.5). Taking turns, every trial's proposal comes from a model fitted on all the trials,
half of them from each: the worst objective went from -5.5 to -0.6 for a little less on
GP's best ones (benchmarks/README.md, "Search quality with trials in flight").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState


class TakingTurns(BaseSampler):
    """Trial `n` is proposed by member `n mod len(members)`; every member sees every trial
    end (`after_trial`), so each one's model holds the whole study."""

    def __init__(self, members: Sequence[BaseSampler]) -> None:
        if not members:
            raise ValueError("TakingTurns needs at least one sampler")
        self.members = tuple(members)

    def member_for(self, trial: FrozenTrial) -> BaseSampler:
        """The sampler that proposes `trial`'s parameters."""
        return self.members[trial.number % len(self.members)]

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self.member_for(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self.member_for(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        member = self.member_for(trial)
        return member.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.member_for(trial).before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        for member in self.members:
            member.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        for member in self.members:
            member.reseed_rng()
