"""`study.search_space`: resolved from the spec's folder, imported once, refused early.

The driver runs the spec's define-by-run function by design (docs/design.md, rule (a)). These
run the real loop with the stand-in dispatcher, from a working directory that is not the
spec's folder, as a user running `submit-study path/to/spec.toml` does.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import optuna
import pytest
from stand_in import StandInDispatcher

from trialq.cli import submit_study_main
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.progress import NoProgress
from trialq.driver.search_space import load_search_space
from trialq.driver.study import open_study
from trialq.errors import SpecError
from trialq.spec import load_spec
from trialq.wire.messages import Outcome

SPACE_MODULE = """
    from pathlib import Path

    _imports = Path(__file__).with_name("imports.txt")
    _imports.write_text(str(int(_imports.read_text()) + 1 if _imports.exists() else 1))

    def define(trial):
        trial.suggest_float("x", 0.0, 1.0)
        if trial.suggest_categorical("kind", ["a", "b"]) == "a":
            trial.suggest_int("width", 8, 64, log=True)
"""


def _spec(folder: Path, search_space: str, n_trials: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "study.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "space"
            n_trials = {n_trials}
            search_space = "{search_space}"
            [trial]
            entrypoint = "trials:quadratic"
            """
        )
    )
    return path


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The spec lives in tmp_path/project; the user stands in tmp_path/cwd."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path / "project"


@pytest.mark.parametrize("reference", ["spaces/space.py:define", "spacemod:define"])
def test_the_space_is_found_from_the_specs_folder_and_its_module_runs_once(
    elsewhere: Path, tmp_path: Path, reference: str
) -> None:
    module_file = elsewhere / ("spaces/space.py" if ".py" in reference else "spacemod.py")
    module_file.parent.mkdir(parents=True)
    module_file.write_text(textwrap.dedent(SPACE_MODULE))
    spec = load_spec(_spec(elsewhere, reference))
    study = open_study(spec, f"sqlite:///{tmp_path / 'space.db'}")
    script: list[dict[str, object]] = [
        {"outcome": Outcome.OK, "metrics": {"value": float(n)}} for n in range(3)
    ]
    driver = StudyDriver(
        spec,
        study,
        StandInDispatcher(script),
        NoProgress(),
        DriverOptions(max_in_flight=1, poll_interval_s=0),
    )

    driver.run()

    trials = study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    assert len(trials) == 3
    assert all({"x", "kind"} <= set(t.params) for t in trials)
    assert module_file.with_name("imports.txt").read_text() == "1"


def test_a_space_whose_module_fails_is_one_line_naming_the_key(elsewhere: Path) -> None:
    (elsewhere / "broken.py").parent.mkdir(parents=True)
    (elsewhere / "broken.py").write_text("import no_such_package_here\n\ndef define(trial): ...\n")
    spec = load_spec(_spec(elsewhere, "broken.py:define"))

    with pytest.raises(SpecError) as raised:
        load_search_space(spec)

    text = str(raised.value)
    assert "study.search_space" in text and "ModuleNotFoundError" in text
    assert "no_such_package_here" in text and "\n" not in text


def test_submit_study_refuses_such_a_spec_before_the_study_exists(
    elsewhere: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere.mkdir(parents=True)
    (elsewhere / "raising.py").write_text(
        "raise RuntimeError('no GPU config here')\n\ndef define(trial): ...\n"
    )
    spec_path = _spec(elsewhere, "raising.py:define")
    database = tmp_path / "never.db"

    code = submit_study_main(
        [str(spec_path), "--storage", f"sqlite:///{database}", "--broker", "redis://127.0.0.1:1/0"]
    )

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "RuntimeError: no GPU config here" in err[0]
    assert not database.exists()

