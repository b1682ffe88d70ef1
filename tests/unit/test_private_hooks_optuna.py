"""The private names of Optuna that the driver's storage and loop lean on are still there,
with the shape they use (docs/design.md, "Private hooks we lean on").

`trialq.driver._storage.sql` writes Optuna's tables itself, through its SQLAlchemy models;
the driver's copy of the study and its lock unwrap Optuna's cache layer; the loop reaches a
trial's id and cached copy. Checked on real storages (SQLite; PostgreSQL for its sequence).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState
from private_hooks import Hook, parameters

from trialq.driver._storage.mirror import MirroredStorage
from trialq.driver._storage.sql import reserve_trial_ids

SQL = "src/trialq/driver/_storage/sql.py"
MIRROR = "src/trialq/driver/_storage/mirror.py"
STORE = "src/trialq/driver/_storage/store.py"
LOOP = "src/trialq/driver/loop.py"
LOCK = "src/trialq/driver/study_lock.py"
WATCH = "src/trialq/driver/watch.py"

WRITTEN_COLUMNS = {
    "StudyModel": {"study_id"},
    "TrialModel": {"trial_id", "study_id", "number", "state", "datetime_start", "datetime_complete"},
    "TrialParamModel": {"trial_id", "param_name", "param_value", "distribution_json"},
    "TrialSystemAttributeModel": {"trial_id", "key", "value_json"},
    "TrialUserAttributeModel": {"trial_id", "key", "value_json"},
    "TrialIntermediateValueModel": {
        "trial_id", "step", "intermediate_value", "intermediate_value_type",
    },
    "TrialValueModel": {"trial_id", "objective", "value", "value_type"},
}  # fmt: skip
"""Each model `sql.py` reads or writes, and the columns it names."""

UPSERT_KEYS = {
    "TrialSystemAttributeModel": "key",
    "TrialUserAttributeModel": "key",
    "TrialIntermediateValueModel": "step",
}
"""The models `sql.py` upserts (ON CONFLICT (trial_id, key)), and their key."""


def _models_hook(name: str) -> Hook:
    return Hook(
        f"optuna.storages._rdb.models.{name}",
        SQL,
        "the driver cannot write trials: every batch of params, attrs, values and states "
        "goes through these tables",
    )


STORED_REPR = Hook(
    "optuna.storages._rdb.models TrialIntermediateValueModel.intermediate_value_to_stored_repr"
    " and TrialValueModel.value_to_stored_repr",
    f"{SQL} (_write_rows)",
    "reports and objective values (inf and nan among them) cannot be written as Optuna reads them",
)
SERIAL_TRIAL_ID = Hook(
    "optuna.storages._rdb.models.TrialModel.trial_id as a serial column on PostgreSQL",
    f"{SQL} (reserve_trial_ids)",
    "every new trial is inserted at ask in a transaction of its own, no longer with the rest "
    "of the driver's step",
)
FROZEN_STUDY = Hook(
    "optuna.study._frozen.FrozenStudy",
    f"{MIRROR} (get_all_studies)",
    "the driver does not import",
)
CACHED_BACKEND = Hook(
    "optuna.storages._cached_storage._CachedStorage._backend",
    f"{MIRROR} (rdb_under, used by mirrored and holding_study)",
    "submit-study stops at its start (AttributeError, exit 4): it is read without a default, "
    "since running unmirrored would also skip the study lock and let a second submit-study in",
)
CREATE_NEW_TRIAL = Hook(
    "optuna.storages.RDBStorage._create_new_trial(self, study_id, template_trial=None)",
    f"{MIRROR} (MirroredStorage.create_new_trial)",
    "enqueued and added trials (study.enqueue_trial, add_trial) cannot be created",
)
STUDY_STORAGE = Hook(
    "optuna.Study._storage",
    f"{STORE} (store_for) and {LOCK}",
    "the driver cannot reach its copy of the study: nothing is flushed or locked",
)
STUDY_ID = Hook(
    "optuna.Study._study_id",
    f"{LOCK} (holding_study)",
    "the study lock cannot be named: the driver does not start",
)
TRIAL_ID = Hook(
    "optuna.Trial._trial_id and optuna.Trial(study, trial_id)",
    f"{LOOP}, {WATCH}, {STORE} and {MIRROR}",
    "the driver cannot re-attach trials or write a trial's attrs and reports",
)
FROZEN_TRIAL_ID = Hook(
    "optuna.trial.FrozenTrial._trial_id",
    f"{MIRROR}, {LOOP} (_reattach) and {WATCH} (finished elsewhere)",
    "the driver's copy cannot index its trials",
)
CACHED_FROZEN_TRIAL = Hook(
    "optuna.Trial._cached_frozen_trial",
    f"{STORE} (set_attrs, record_intermediate)",
    "a trial's attrs written in one transaction are not seen through trial.user_attrs, and a "
    "retried attempt's report is dropped instead of replacing the earlier one",
)


@pytest.fixture
def storage_url(tmp_path: Path) -> str:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return f"sqlite:///{tmp_path / 'hooks.db'}"


@pytest.fixture
def study(storage_url: str) -> Iterator[optuna.Study]:
    """A study on the driver's own storage, as `trialq.driver.study` makes it."""
    storage = MirroredStorage(optuna.storages.RDBStorage(storage_url))
    yield optuna.create_study(storage=storage, study_name="hooks")
    storage.flush()
    storage.backend.engine.dispose()


@pytest.mark.parametrize("name", sorted(WRITTEN_COLUMNS))
def test_the_models_sql_writes_have_its_columns(name: str) -> None:
    hook = _models_hook(name)
    try:
        from optuna.storages._rdb import models
    except ImportError as exc:
        pytest.fail(hook.gone(f"the module is gone: {exc}"))
    model = getattr(models, name, None)
    assert model is not None, hook.gone("no such model")
    columns = {column.name for column in model.__table__.columns}
    missing = WRITTEN_COLUMNS[name] - columns
    assert not missing, hook.gone(f"no column {sorted(missing)} (it has {sorted(columns)})")
    key = UPSERT_KEYS.get(name)
    if key is not None:
        unique = [
            {column.name for column in constraint.columns}
            for constraint in model.__table__.constraints
            if constraint.__class__.__name__ in ("UniqueConstraint", "PrimaryKeyConstraint")
        ]
        assert {"trial_id", key} in unique, hook.gone(
            f"(trial_id, {key}) is not unique, so its upsert has no conflict to catch"
        )


def test_the_models_store_values_as_optuna_reads_them() -> None:
    from optuna.storages._rdb import models

    hook = STORED_REPR
    for model, method in (
        (models.TrialIntermediateValueModel, "intermediate_value_to_stored_repr"),
        (models.TrialValueModel, "value_to_stored_repr"),
    ):
        function = getattr(model, method, None)
        assert function is not None, hook.gone(f"no {model.__name__}.{method}")
        assert parameters(function) == ["value"], hook.gone(
            f"{method} takes {parameters(function)}, not one value"
        )
        for value in (0.5, math.inf, -math.inf, math.nan):
            stored, kind = function(value)
            assert stored is None or isinstance(stored, float), hook.gone(f"{value} -> {stored}")
            assert kind is not None, hook.gone(f"{method}({value}) gives no value type")


def test_trial_ids_come_from_a_sequence_on_postgresql(postgres_url: str) -> None:
    hook = SERIAL_TRIAL_ID
    rdb = optuna.storages.RDBStorage(postgres_url)
    try:
        reserved = reserve_trial_ids(rdb, 2)
    finally:
        rdb.engine.dispose()
    assert reserved is not None, hook.gone("trials.trial_id has no sequence on PostgreSQL")
    assert len(set(reserved)) == 2, hook.gone(f"the sequence gave {reserved}")


def test_frozen_study_is_what_storages_return(storage_url: str) -> None:
    hook = FROZEN_STUDY
    try:
        from optuna.study._frozen import FrozenStudy
    except ImportError as exc:
        pytest.fail(hook.gone(f"it cannot be imported: {exc}"))
    optuna.create_study(storage=storage_url, study_name="frozen")
    studies = optuna.storages.RDBStorage(storage_url).get_all_studies()
    assert [type(s) for s in studies] == [FrozenStudy], hook.gone(f"storages return {studies}")


def test_optunas_cache_layer_keeps_its_rdb_storage_in_backend(storage_url: str) -> None:
    hook = CACHED_BACKEND
    storage = optuna.storages.get_storage(storage_url)
    backend = getattr(storage, "_backend", None)
    assert isinstance(backend, optuna.storages.RDBStorage), hook.gone(
        f"get_storage gave a {type(storage).__name__} whose _backend is {backend!r}"
    )


def test_rdb_storage_creates_a_trial_from_a_template(storage_url: str) -> None:
    hook = CREATE_NEW_TRIAL
    rdb = optuna.storages.RDBStorage(storage_url)
    create = getattr(rdb, "_create_new_trial", None)
    assert create is not None, hook.gone("no such method")
    assert parameters(create) == ["study_id", "template_trial"], hook.gone(
        f"its parameters are {parameters(create)}"
    )
    study_id = rdb.create_new_study([optuna.study.StudyDirection.MINIMIZE], "template")
    template = optuna.trial.create_trial(state=TrialState.WAITING, params={}, distributions={})
    created = create(study_id, template)
    assert isinstance(created, FrozenTrial), hook.gone(f"it returned {created!r}")
    assert (created.number, created.state) == (0, TrialState.WAITING), hook.gone(
        f"it made trial {created.number} in state {created.state}"
    )


def test_a_study_keeps_its_storage_and_id(study: optuna.Study) -> None:
    storage = getattr(study, "_storage", None)
    assert isinstance(storage, MirroredStorage), STUDY_STORAGE.gone(
        f"a study made on the driver's storage has _storage {storage!r}"
    )
    study_id = getattr(study, "_study_id", None)
    assert study_id == storage.get_study_id_from_name("hooks"), STUDY_ID.gone(
        f"_study_id is {study_id!r}"
    )


def test_a_trial_keeps_its_id(study: optuna.Study) -> None:
    hook = TRIAL_ID
    asked = study.ask()
    trial_id = getattr(asked, "_trial_id", None)
    assert isinstance(trial_id, int), hook.gone(f"an asked trial's _trial_id is {trial_id!r}")
    assert parameters(optuna.Trial) == ["study", "trial_id"], hook.gone(
        f"optuna.Trial takes {parameters(optuna.Trial)}"
    )
    again = optuna.Trial(study, trial_id)
    assert again.number == asked.number, hook.gone("Trial(study, trial_id) is another trial")


def test_a_frozen_trial_keeps_its_id(study: optuna.Study) -> None:
    hook = FROZEN_TRIAL_ID
    asked = study.ask()
    (frozen,) = study.get_trials(deepcopy=False)
    assert getattr(frozen, "_trial_id", None) == asked._trial_id, hook.gone(
        f"a FrozenTrial's _trial_id is {getattr(frozen, '_trial_id', None)!r}"
    )


def test_a_trial_reads_its_attrs_and_reports_from_its_cached_copy(study: optuna.Study) -> None:
    hook = CACHED_FROZEN_TRIAL
    trial = study.ask()
    cached = getattr(trial, "_cached_frozen_trial", None)
    assert isinstance(cached, FrozenTrial), hook.gone(f"it is {cached!r}")
    cached.user_attrs["written_around_optuna"] = 1
    assert trial.user_attrs.get("written_around_optuna") == 1, hook.gone(
        "trial.user_attrs no longer reads it"
    )
    trial.report(1.0, step=3)
    assert cached.intermediate_values == {3: 1.0}, hook.gone(
        f"trial.report no longer records in it: {cached.intermediate_values}"
    )
