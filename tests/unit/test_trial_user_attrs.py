"""`trial.set_user_attr` in a trial's process, as Optuna's: JSON values kept for the driver
to store under their own names; a value that is not JSON, or one of trialq's own names, is
refused at the call, with the name."""

from __future__ import annotations

import math

import pytest

from trialq.trial.context import TrialContext
from trialq.wire.channel import TrialAddress


def _context() -> TrialContext:
    return TrialContext(TrialAddress("s", 0, 1), {"x": 1.0}, None)


def test_json_values_are_kept_the_last_one_wins() -> None:
    trial = _context()
    trial.set_user_attr("acc", 0.5)
    trial.set_user_attr("acc", 0.75)
    trial.set_user_attr("tags", ["a", {"b": None}])
    trial.set_user_attr("nan", math.nan)  # Optuna's storages keep NaN too
    kept = trial.user_attrs
    assert kept["acc"] == 0.75 and kept["tags"] == ["a", {"b": None}]
    assert math.isnan(kept["nan"])
    kept["acc"] = 0.0
    assert trial.user_attrs["acc"] == 0.75, "a copy"


def test_a_value_that_is_not_json_is_refused_with_its_key() -> None:
    with pytest.raises(TypeError, match="set_user_attr 'model': the value is not JSON"):
        _context().set_user_attr("model", object())


@pytest.mark.parametrize("key", ["outcome", "metrics", "worker_pid", "attempts"])
def test_trialqs_own_names_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match=f"{key!r} is a user attr trialq records itself"):
        _context().set_user_attr(key, 1)


def test_a_key_that_is_not_a_str_is_refused() -> None:
    with pytest.raises(TypeError, match="the key must be a str, not int"):
        _context().set_user_attr(3, 1)  # type: ignore[arg-type]
