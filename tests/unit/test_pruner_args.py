"""The pruner's rehearsal: a value no range check knows of that fails only when the pruner
prunes fails at load, as one line, and a pruner that works is left as built."""

from __future__ import annotations

import optuna
import pytest

from trialq.driver.pruner_args import rehearse
from trialq.errors import SpecError


@pytest.mark.parametrize(
    ("pruner", "failure"),
    [
        (lambda: optuna.pruners.HyperbandPruner(min_resource=0), "ZeroDivisionError"),
        (lambda: optuna.pruners.HyperbandPruner(reduction_factor=1), "ZeroDivisionError"),
        (lambda: optuna.pruners.HyperbandPruner(max_resource=0), "ValueError: math domain"),
    ],
    ids=["min_resource 0", "reduction_factor 1", "max_resource 0"],
)
def test_a_pruner_built_without_a_word_that_fails_when_it_prunes_fails_its_rehearsal(
    pruner: object, failure: str
) -> None:
    with pytest.raises(
        SpecError, match=f"^study.pruner_args: the pruner fails when it prunes: {failure}"
    ):
        rehearse(pruner(), "study.pruner_args")  # type: ignore[operator]


@pytest.mark.parametrize(
    "pruner",
    [optuna.pruners.MedianPruner, optuna.pruners.HyperbandPruner, optuna.pruners.NopPruner,
     optuna.pruners.SuccessiveHalvingPruner],
)  # fmt: skip
def test_the_spec_pruners_with_their_defaults_pass_their_rehearsal(pruner: type) -> None:
    rehearse(pruner(), "study.pruner_args")
