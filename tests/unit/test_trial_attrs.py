"""A trial's user attrs written at once land exactly as `set_user_attr` one by one would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from trialq.driver._storage.attrs import set_user_attrs

ATTRS: dict[str, Any] = {
    "outcome": "ok",
    "worker_pid": 4321,
    "duration_s": 1.25,
    "gpu_peak_bytes": None,
    "metrics": {"val_accuracy": 0.9, "loss": 0.3},
    "error": None,
    "task_id": "second",
}


def _sqlite_study(tmp_path: Path) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=f"sqlite:///{tmp_path / 'attrs.db'}", study_name="attrs")


def test_one_write_records_every_attr_and_overwrites_earlier_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = _sqlite_study(tmp_path)
    trial = study.ask()
    trial.set_user_attr("task_id", "first")

    def one_by_one(*args: object) -> None:
        raise AssertionError("wrote attrs one transaction each")

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_user_attr", one_by_one)
    set_user_attrs(trial, ATTRS)
    study.tell(trial, 1.0)

    reloaded = optuna.load_study(study_name="attrs", storage=f"sqlite:///{tmp_path / 'attrs.db'}")
    assert reloaded.trials[0].user_attrs == ATTRS
    assert trial.user_attrs == ATTRS


def test_a_finished_trial_is_refused_as_optuna_refuses_it(tmp_path: Path) -> None:
    study = _sqlite_study(tmp_path)
    trial = study.ask()
    study.tell(trial, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        set_user_attrs(trial, ATTRS)


def test_other_storages_get_one_set_user_attr_a_key() -> None:
    study = optuna.create_study()
    trial = study.ask()
    set_user_attrs(trial, ATTRS)
    study.tell(trial, 1.0)
    assert study.trials[0].user_attrs == ATTRS
