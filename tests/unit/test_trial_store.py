"""The driver's one way into the storage (`trialq.driver._storage.store`): a trial's user
attrs written at once land exactly as `set_user_attr` one by one would, on trialq's mirrored
storage and on Optuna's in-memory one; a storage the driver does not write through is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from trialq.driver._storage.mirror import MirroredStorage
from trialq.driver._storage.store import (
    InMemoryTrialStore,
    MirroredTrialStore,
    TrialStore,
    store_for,
)
from trialq.wire.messages import ARTIFACTS_ATTR_PREFIX, ArtifactMeta

ATTRS: dict[str, Any] = {
    "outcome": "ok",
    "worker_pid": 4321,
    "duration_s": 1.25,
    "gpu_peak_bytes": None,
    "metrics": {"val_accuracy": 0.9, "loss": 0.3},
    "error": None,
    "task_id": "second",
}


def _mirrored_study(tmp_path: Path) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = MirroredStorage(optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'attrs.db'}"))
    return optuna.create_study(storage=storage, study_name="attrs")


@pytest.fixture(params=["mirrored", "in-memory"])
def study(request: pytest.FixtureRequest, tmp_path: Path) -> optuna.Study:
    if request.param == "mirrored":
        return _mirrored_study(tmp_path)
    return optuna.create_study(storage=optuna.storages.InMemoryStorage())


def test_the_store_is_picked_from_the_storage(tmp_path: Path) -> None:
    assert isinstance(store_for(_mirrored_study(tmp_path)), MirroredTrialStore)
    assert isinstance(store_for(optuna.create_study()), InMemoryTrialStore)
    bare = optuna.create_study(storage=f"sqlite:///{tmp_path / 'bare.db'}")
    with pytest.raises(TypeError, match="not _CachedStorage"):
        store_for(bare)


def test_one_write_records_every_attr_and_overwrites_earlier_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = _mirrored_study(tmp_path)
    store = store_for(study)
    trial = study.ask()
    store.set_attrs(trial, {"task_id": "first"})

    def one_by_one(*args: object) -> None:
        raise AssertionError("wrote attrs one transaction each")

    monkeypatch.setattr(optuna.storages.RDBStorage, "set_trial_user_attr", one_by_one)
    store.set_attrs(trial, ATTRS)
    store.tell(trial, optuna.trial.TrialState.COMPLETE, [1.0])
    store.flush()

    reloaded = optuna.load_study(study_name="attrs", storage=f"sqlite:///{tmp_path / 'attrs.db'}")
    assert reloaded.trials[0].user_attrs == ATTRS
    assert trial.user_attrs == ATTRS


def test_a_finished_trial_is_refused_as_optuna_refuses_it(study: optuna.Study) -> None:
    store = store_for(study)
    trial = study.ask()
    store.tell(trial, optuna.trial.TrialState.COMPLETE, [1.0])
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        store.set_attrs(trial, ATTRS)


def test_annotate_never_raises_on_a_finished_trial(study: optuna.Study) -> None:
    store = store_for(study)
    trial = study.ask()
    study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)

    store.annotate(trial, {"outcome": "stopped"})
    store.flush()

    if isinstance(store, MirroredTrialStore):  # the in-memory storage refuses, and says so
        assert study._storage.get_trial(trial._trial_id).user_attrs["outcome"] == "stopped"


def test_a_retried_attempts_report_replaces_the_earlier_one(study: optuna.Study) -> None:
    store: TrialStore = store_for(study)
    trial = study.ask()
    store.record_intermediate(trial, 3, 0.5)
    store.record_intermediate(trial, 3, 0.25)
    store.flush()

    assert study._storage.get_trial(trial._trial_id).intermediate_values == {3: 0.25}


def test_artifacts_are_linked_as_optuna_links_them(study: optuna.Study) -> None:
    store = store_for(study)
    trial = study.ask()
    meta = ArtifactMeta(
        artifact_id="0" * 8 + "-0000-0000-0000-" + "0" * 12, filename="w.pt", mimetype="x/y"
    )

    store.link_artifacts(trial, [meta])
    store.flush()

    attrs = study._storage.get_trial(trial._trial_id).system_attrs
    assert attrs[ARTIFACTS_ATTR_PREFIX + meta.artifact_id] == meta.model_dump_json()
