"""`TakingTurns` (issue 29): samplers proposing a trial each in turn over one study, and the
`gp+tpe` pair that `auto` builds for a short, wide study."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from trialq.driver.sampling.taking_turns import TakingTurns
from trialq.driver.study import make_sampler
from trialq.spec import StudySpec

SPACE = {"x": FloatDistribution(0, 1), "y": FloatDistribution(0, 1)}


class _Recording(optuna.samplers.RandomSampler):
    """Optuna's random sampler, noting the trials it proposed and the ends it was told."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed=seed)
        self.proposed: list[int] = []
        self.ended: list[int] = []

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, name: str, dist: BaseDistribution
    ) -> float:
        self.proposed.append(trial.number)
        return float(super().sample_independent(study, trial, name, dist))

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: list[float] | None,
    ) -> None:
        self.ended.append(trial.number)


def test_each_trial_is_proposed_by_one_member_in_turn_and_every_member_sees_every_end() -> None:
    first, second = _Recording(0), _Recording(1)
    study = optuna.create_study(sampler=TakingTurns([first, second]))
    running = [study.ask(SPACE) for _ in range(3)]  # three in flight, as a driver asks
    for trial in running:
        study.tell(trial, trial.params["x"])
    for _ in range(3):
        trial = study.ask(SPACE)
        study.tell(trial, trial.params["x"])

    assert sorted(set(first.proposed)) == [0, 2, 4] and sorted(set(second.proposed)) == [1, 3, 5]
    assert first.ended == second.ended == [0, 1, 2, 3, 4, 5]


def test_no_members_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one sampler"):
        TakingTurns([])


def test_the_gp_and_tpe_pair_runs_a_study_with_trials_in_flight() -> None:
    """`sampler = "gp+tpe"` through the driver's builder, on a real study: 24 trials, 4 in
    flight, past the start into both models; nothing running is proposed twice."""
    pytest.importorskip("torch")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    spec = StudySpec.model_validate(
        {
            "path": Path("spec.toml"),
            "study": {"name": "s", "n_trials": 24, "max_in_flight": 4, "sampler": "gp+tpe",
                      "sampler_args": {"seed": 0}},
            "trial": {"entrypoint": "mod:train"},
            "space": {"x": {"type": "float", "low": 0, "high": 1},
                      "y": {"type": "float", "low": 0, "high": 1}},
        }
    )  # fmt: skip
    study = optuna.create_study(sampler=make_sampler(spec))
    running: list[optuna.Trial] = []
    for _ in range(24):
        trial = study.ask(SPACE)
        assert trial.params not in [r.params for r in running]
        running.append(trial)
        if len(running) == 4:
            done = running.pop(0)
            study.tell(done, (done.params["x"] - 0.3) ** 2 + (done.params["y"] - 0.7) ** 2)
    for done in running:
        study.tell(done, (done.params["x"] - 0.3) ** 2 + (done.params["y"] - 0.7) ** 2)

    assert len(study.get_trials(states=(TrialState.COMPLETE,))) == 24
    assert study.best_value < 0.01, "the models found the optimum's neighbourhood"
