"""What a sampler reads of a large study: an index kept as trials finish, and TPE's history
bounded past a size.

Optuna's TPE reads every finished trial and fits its two densities on all of them, once for
each parameter, on every ask: a driver's cost a trial grew with the study (12 ms a
trial at the start of a 10,000-trial study, 132 ms at its end). Two things keep it flat:

- `TrialIndex` learns which trials finished from the trials that changed since it last
  looked (new ones, and the ones it saw unfinished): O(trials in flight) an ask, not
  O(study). `DistinctFromRunning` reads the running trials' params from it too.
- `BoundedTPE` is TPE shown, once more than `KEPT_BEST + KEPT_RECENT` trials have
  finished, only the `KEPT_BEST` best complete trials and the `KEPT_RECENT` most recently
  finished ones (and the running ones, for its constant liar), in number order. TPE's
  "good" density is fitted on its best `min(ceil(n / 10), 25)` trials: with `KEPT_BEST` at
  least 25 those are the same trials as without the bound; only the "bad" density forgets
  old, mediocre trials (which TPE's default weights already count least). Below the bound
  TPE reads the study itself: a study of up to `KEPT_BEST + KEPT_RECENT` trials is sampled
  exactly as without it. Measured: benchmarks/README.md, "Scale".
- With several objectives TPE calls good its best `ceil(n / 10)` finished trials by
  non-dominated front, with no cap. Past the bound it is still told that share of every
  finished trial, not of those it reads, and the best kept are the first whole fronts
  holding at least that many (and `KEPT_BEST`): its "good" trials are the ones it would pick
  unbounded (a trial dropped from the fronts is dominated by one kept, so no later trial it
  dominates can rise into them), save one dropped while the share was smaller; its "bad"
  density reads the rest of those fronts and the `KEPT_RECENT` latest. Telling it a tenth
  of what it reads instead cost hypervolume beyond noise (benchmarks/README.md, "Several
  objectives, bounded").
"""

from __future__ import annotations

import copy
import heapq
from collections import deque
from collections.abc import Container, Sequence
from typing import Any, cast

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import TPESampler
from optuna.samplers._tpe.sampler import default_gamma_multiobjective
from optuna.search_space import IntersectionSearchSpace
from optuna.search_space.group_decomposed import _GroupDecomposedSearchSpace
from optuna.study import StudyDirection
from optuna.study._multi_objective import _fast_non_domination_rank
from optuna.trial import FrozenTrial, TrialState

KEPT_BEST = 50
"""The best complete trials TPE keeps past the bound: twice the most it calls good (25) with
one objective; with several, at least this many, in whole fronts."""

KEPT_RECENT = 450
"""The most recently finished trials TPE keeps past the bound."""

LEARNT_FROM = (TrialState.COMPLETE, TrialState.PRUNED)
"""The finished states TPE reads (a failed trial teaches it nothing)."""


class TrialIndex:
    """A study's trials as a sampler reads them, learnt from what changed since the last look.

    Trials are numbered 0, 1, ... in the study, and the driver's storage lists them in that
    order, so a trial's number is its place in `get_all_trials`; only the new trials and the
    ones seen unfinished are looked at again."""

    def __init__(self, directions: Sequence[StudyDirection], best: int, recent: int) -> None:
        self._signs = [-1.0 if d is StudyDirection.MAXIMIZE else 1.0 for d in directions]
        self._best_size, self._recent = best, deque[int](maxlen=recent)
        self._best: list[tuple[float, int]] = []  # a heap of (-loss, number): worst kept on top
        self._fronts: list[tuple[tuple[float, ...], int]] = []  # (losses, number), several
        self._unfinished: set[int] = set()
        self._looked_at = 0
        self._trials: list[FrozenTrial] = []
        self.learnt = 0
        """Trials finished COMPLETE or PRUNED so far."""

    def refresh(self, study: optuna.Study) -> None:
        """Look at the trials that may have changed since the last look."""
        trials = study._storage.get_all_trials(study._study_id, deepcopy=False)
        if any(t.number != i for i, t in ((i, trials[i]) for i in _ends(len(trials)))):
            raise ValueError("the storage does not list trials in number order")
        new = range(self._looked_at, len(trials))
        for number in [*self._unfinished, *new]:
            self._look_at(trials[number])
        self._trials, self._looked_at = trials, len(trials)

    def running(self) -> list[FrozenTrial]:
        """The trials running at the last look."""
        trials = (self._trials[n] for n in sorted(self._unfinished))
        return [t for t in trials if t.state is TrialState.RUNNING]

    def kept(self) -> list[FrozenTrial]:
        """The best and the most recent finished trials, and the running ones, in number
        order (TPE weighs the older trials less)."""
        best = {n for _, n in self._best} | {n for _, n in self._fronts}
        numbers = best | set(self._recent) | self._unfinished
        return [self._trials[n] for n in sorted(numbers)]

    def _look_at(self, trial: FrozenTrial) -> None:
        if not trial.state.is_finished():
            self._unfinished.add(trial.number)
            return
        self._unfinished.discard(trial.number)
        if trial.state not in LEARNT_FROM:
            return
        self.learnt += 1
        self._recent.append(trial.number)
        if trial.state is not TrialState.COMPLETE or trial.values is None:
            return
        if len(self._signs) > 1:
            self._keep_fronts(trial)
            return
        scored = (-self._signs[0] * trial.values[0], trial.number)
        if len(self._best) < self._best_size:
            heapq.heappush(self._best, scored)
        elif self._best and scored > self._best[0]:
            heapq.heapreplace(self._best, scored)

    def _keep_fronts(self, trial: FrozenTrial) -> None:
        """Several objectives: the trial joins the kept fronts; past twice their size they
        are cut back to the first whole fronts holding `best` trials or more."""
        losses = tuple(sign * value for sign, value in zip(self._signs, trial.values, strict=True))
        self._fronts.append((losses, trial.number))
        held = max(self._best_size, default_gamma_multiobjective(self.learnt))
        if self._best_size and len(self._fronts) > 2 * held:
            self._fronts = first_fronts(self._fronts, held)


def first_fronts(
    scored: list[tuple[tuple[float, ...], int]], at_least: int
) -> list[tuple[tuple[float, ...], int]]:
    """The first non-dominated fronts of `scored` ((losses, number) pairs, all minimised),
    whole, holding `at_least` of them or more (all of them if fewer)."""
    if len(scored) <= at_least:
        return list(scored)
    ranks = _fast_non_domination_rank(np.array([losses for losses, _ in scored]))
    last = np.sort(ranks)[at_least - 1]
    return [pair for pair, rank in zip(scored, ranks, strict=True) if rank <= last]


def _ends(n: int) -> tuple[int, ...]:
    """The places checked for the number order: the first and the last."""
    return (0, n - 1) if n else ()


class _BoundedStudy:
    """The study as TPE sees it past the bound: every read of trials answers from the kept
    ones; everything else is the study's."""

    def __init__(self, study: optuna.Study, kept: list[FrozenTrial]) -> None:
        self._study, self._kept = study, kept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(
        self,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
        use_cache: bool = False,
    ) -> list[FrozenTrial]:
        trials = [t for t in self._kept if states is None or t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    def get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        return self._get_trials(deepcopy, states)


class BoundedTPE(TPESampler):
    """Optuna's TPE reading, past `kept_best + kept_recent` finished trials, only the best
    (`KEPT_BEST`; whole fronts with several objectives) and the most recent (`KEPT_RECENT`);
    every other argument is TPE's own."""

    def __init__(
        self, *args: Any, kept_best: int = KEPT_BEST, kept_recent: int = KEPT_RECENT, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._kept_best, self._kept_recent = kept_best, kept_recent
        self._gamma_given = self._gamma is not None
        self._index: TrialIndex | None = None
        self._index_of = -1  # the study id the index is of
        self._space_of = -1  # the study id the multivariate search space is of

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        """TPE's, learnt afresh for a new study: an ask process's copy of the study is made
        again past a size (`asking.replica`), and Optuna's multivariate search space refuses
        a second study."""
        if self._space_of != study._study_id:
            self._search_space = IntersectionSearchSpace(include_pruned=True)
            if self._group:
                self._group_decomposed_search_space = _GroupDecomposedSearchSpace(True)
            self._space_of = study._study_id
        return super().infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        return super().sample_relative(self._seen(study), trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        seen = self._seen(study)
        return super().sample_independent(seen, trial, param_name, param_distribution)

    def _seen(self, study: optuna.Study) -> optuna.Study:
        """The study as TPE reads it now: itself, or bounded past the bound."""
        if self._index is None or self._index_of != study._study_id:
            self._index = TrialIndex(study.directions, self._kept_best, self._kept_recent)
            self._index_of = study._study_id
        self._index.refresh(study)
        if self._index.learnt <= self._kept_best + self._kept_recent:
            return study
        if len(study.directions) > 1 and not self._gamma_given:
            self._gamma = self._good_of_every_trial
        return cast(optuna.Study, _BoundedStudy(study, self._index.kept()))

    def _good_of_every_trial(self, n: int) -> int:
        """How many trials TPE calls good with several objectives: Optuna's share of every
        finished trial, not of the `n` it reads past the bound."""
        learnt = self._index.learnt if self._index is not None else n
        return default_gamma_multiobjective(max(n, learnt))
