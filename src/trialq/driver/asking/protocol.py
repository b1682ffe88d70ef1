"""What the driver and an ask process say to each other, over one socket each (pickled by
`multiprocessing.connection`). The driver speaks first (`Start`); `None` ends the process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from trialq.spec import StudySpec


@dataclass(frozen=True)
class Start:
    """The study this process asks for, its sampler's seed, and the trials so far."""

    spec: StudySpec
    seed: int | None
    trials: list[FrozenTrial]


@dataclass(frozen=True)
class Changes:
    """Trials new or changed since the last `Changes`, and this process's asks the driver is
    done with (adopted as one of those trials, or dropped)."""

    trials: list[FrozenTrial]
    settled: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class AskFor:
    """Draw `count` more trials' params."""

    count: int


@dataclass(frozen=True)
class Asked:
    """One drawn parameter set, numbered by the process that drew it."""

    ask_id: int
    params: dict[str, Any]
    distributions: dict[str, BaseDistribution]


@dataclass(frozen=True)
class Failed:
    """The process stopped on an error: what it was."""

    reason: str


def slim(trial: FrozenTrial) -> FrozenTrial:
    """What a sampler reads of a trial (state, values, params, system attrs such as Optuna's
    constraints), without user attrs and intermediate values. A WAITING trial counts as
    running: its params are the driver's to send, never an ask process's to pop."""
    state = TrialState.RUNNING if trial.state is TrialState.WAITING else trial.state
    return FrozenTrial(
        number=trial.number,
        state=state,
        value=None,
        values=trial.values,
        datetime_start=trial.datetime_start,
        datetime_complete=trial.datetime_complete,
        params=trial.params,
        distributions=trial.distributions,
        user_attrs={},
        system_attrs=trial.system_attrs,
        intermediate_values={},
        trial_id=trial.number,
    )
