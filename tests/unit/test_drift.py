"""A spec that no longer matches the study it resumes: refused with one line naming both
values, or accepted with a note, decided per key. Real SQLite studies."""

from __future__ import annotations

import textwrap
from pathlib import Path

import optuna
import pytest

from trialq.driver._storage.store import store_for
from trialq.driver.drift import check_spec_against_study
from trialq.driver.study import open_study
from trialq.errors import SpecError
from trialq.spec import StudySpec, load_spec

BASE = {
    "direction": '"maximize"',
    "metric": '"score"',
    "sampler": '"tpe"',
    "x": 'type = "float"\nlow = 0\nhigh = 1',
    "act": 'type = "categorical"\nchoices = ["relu", "tanh"]',
}


def _spec(tmp_path: Path, **changes: str) -> StudySpec:
    keys = {**BASE, **changes}
    space = "".join(
        f"[space.{name}]\n{keys[name]}\n" for name in ("x", "act", "units") if keys.get(name)
    )
    path = tmp_path / "study.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "drift"
            direction = {keys["direction"]}
            metric = {keys["metric"]}
            sampler = {keys["sampler"]}
            n_trials = 3
            storage = "sqlite:///drift.db"
            [trial]
            entrypoint = "trials:quadratic"
            """
        )
        + space
    )
    return load_spec(path)


def _resume(spec: StudySpec) -> list[str]:
    study = open_study(spec, f"sqlite:///{spec.directory / 'drift.db'}")
    return check_spec_against_study(spec, study, store_for(study))


@pytest.fixture
def created(tmp_path: Path) -> Path:
    """A study made from the base spec, with one finished trial over its space."""
    spec = _spec(tmp_path)
    study = open_study(spec, f"sqlite:///{tmp_path / 'drift.db'}")
    assert check_spec_against_study(spec, study, store_for(study)) == []
    trial = study.ask()
    trial.suggest_float("x", 0, 1)
    trial.suggest_categorical("act", ["relu", "tanh"])
    study.tell(trial, 0.5)
    store_for(study).flush()
    return tmp_path


@pytest.mark.parametrize(
    ("change", "key", "stored", "wanted"),
    [
        ({"direction": '"minimize"'}, "study.direction", "maximize", "minimize"),
        ({"metric": '"loss"'}, "study.metric", "score", "loss"),
        ({"x": 'type = "int"\nlow = 0\nhigh = 1'}, "space.x", "float [0.0, 1.0]", "int [0, 1]"),
        (
            {"act": 'type = "categorical"\nchoices = ["relu", "gelu"]'},
            "space.act",
            "categorical ['relu', 'tanh']",
            "categorical ['relu', 'gelu']",
        ),
        ({"x": 'type = "float"\nlow = 0.001\nhigh = 1\nlog = true'}, "space.x", "float", "log"),
    ],
)
def test_a_change_the_stored_trials_cannot_survive_is_refused_naming_both(
    created: Path, change: dict[str, str], key: str, stored: str, wanted: str
) -> None:
    with pytest.raises(SpecError) as refused:
        _resume(_spec(created, **change))
    message = str(refused.value)
    assert f"study.toml: {key}: the study 'drift' was made with {stored}" in message
    assert wanted in message.split("the spec says", 1)[1]
    assert len(message.splitlines()) == 1


def test_a_safe_change_is_accepted_with_one_line_each(created: Path) -> None:
    notes = _resume(
        _spec(
            created,
            sampler='"random"',
            x='type = "float"\nlow = 0\nhigh = 2',
            units='type = "int"\nlow = 8\nhigh = 64',
        )
    )
    assert notes == [
        "space.x changed from float [0.0, 1.0] to float [0.0, 2.0]; the stored trials are kept",
        "space changed (+units); the stored trials are kept",
        "study.sampler changed from 'tpe' to 'random'; the stored trials are kept",
    ]
    assert _resume(_spec(created, sampler='"random"', x='type = "float"\nlow = 0\nhigh = 2',
                         units='type = "int"\nlow = 8\nhigh = 64')) == [], "said once"  # fmt: skip


def test_the_same_spec_resumes_silently(created: Path) -> None:
    assert _resume(_spec(created)) == []
    loaded = optuna.load_study(study_name="drift", storage=f"sqlite:///{created / 'drift.db'}")
    assert loaded.user_attrs["trialq_spec"]["metrics"] == ["score"]
