"""`trialq run-trial`: one trial in the caller's own process, its reports printed, told to
no study unless `--tell` asks; a bad `--params` is one line and exit 2."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import optuna
import pytest

from trialq.cli import trialq_main

TRAIN = """
import os
import optuna
from trialq import TrialPruned

def train(params, trial):
    for step in range(3):
        trial.report(params["x"] * step, step)
        if trial.should_prune():
            raise TrialPruned()
    (trial.checkpoint_dir / "saved").write_text("step 3")
    if params["kind"] == "bad":
        raise ValueError("the user's own bug")
    if params["kind"] == "optuna-pruned":
        raise optuna.TrialPruned()
    return {"score": params["x"] * 2, "pid": float(os.getpid())}
"""

SPEC = """
[study]
name = "here"
metric = "score"
direction = "maximize"
n_trials = 4
[trial]
entrypoint = "train.py:train"
[space.x]
type = "float"
low = 0
high = 1
[space.kind]
type = "categorical"
choices = ["good", "bad", "optuna-pruned"]
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(TRAIN)
    path = tmp_path / "here.toml"
    path.write_text(textwrap.dedent(SPEC))
    return path


def test_a_trial_runs_in_this_process_with_its_reports_printed_and_no_study_told(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = trialq_main(["run-trial", str(spec), "--params", '{"x": 0.5, "kind": "good"}'])

    out, err = capsys.readouterr()
    assert code == 0
    assert json.loads(out) == {"score": 1.0, "pid": float(os.getpid())}
    assert "report step 1: 0.5" in err and "report step 2: 1" in err
    assert not (spec.parent / "here.db").exists(), "a study was told without --tell"


def test_a_trial_that_raises_shows_its_traceback_and_exits_1(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = trialq_main(["run-trial", str(spec), "--params", '{"x": 0.5, "kind": "bad"}'])

    assert code == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: the user's own bug" in err


def test_optunas_own_trial_pruned_ends_the_trial_pruned_not_failed(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    params = '{"x": 0.5, "kind": "optuna-pruned"}'
    code = trialq_main(["run-trial", str(spec), "--params", params])

    err = capsys.readouterr().err
    assert code == 0 and "trial pruned" in err and "Traceback" not in err


def test_tell_adds_the_trial_to_the_study_finished_with_its_reports(spec: Path) -> None:
    args = ["run-trial", str(spec), "--params", '{"x": 0.25, "kind": "good"}', "--tell"]

    assert trialq_main(args) == 0

    study = optuna.load_study(study_name="here", storage=f"sqlite:///{spec.parent / 'here.db'}")
    (trial,) = study.trials
    assert trial.state.name == "COMPLETE" and trial.value == 0.5
    assert trial.params == {"x": 0.25, "kind": "good"}
    assert trial.intermediate_values == {0: 0.0, 1: 0.25, 2: 0.5}


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ('{"x": 0.5', "--params is not JSON"),
        ("[0.5]", "--params must be a JSON object"),
        ('{"x": 2, "kind": "good"}', "x = 2 is outside space.x"),
        ('{"x": 0.5, "kind": "ugly"}', "kind = 'ugly' is outside space.kind"),
        ('{"x": 0.5}', "missing kind"),
        ('{"x": 0.5, "kind": "good", "y": 1}', "unknown y"),
    ],
)
def test_bad_params_are_one_line_and_exit_2(
    spec: Path, params: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert trialq_main(["run-trial", str(spec), "--params", params]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


DEFINE_BY_RUN = """
[study]
name = "branches"
metric = "score"
direction = "maximize"
n_trials = 4
search_space = "space.py:space"
[trial]
entrypoint = "train.py:train"
"""

SPACE = """
def space(trial):
    if trial.suggest_categorical("kind", ["good", "bad"]) == "good":
        trial.suggest_float("x", 0, 1)
    else:
        trial.suggest_int("depth", 1, 4)
"""


@pytest.fixture
def branches(spec: Path) -> Path:
    (spec.parent / "space.py").write_text(SPACE)
    path = spec.parent / "branches.toml"
    path.write_text(textwrap.dedent(DEFINE_BY_RUN))
    return path


def test_tell_adds_a_define_by_run_trial_with_the_branch_its_params_take(branches: Path) -> None:
    args = ["run-trial", str(branches), "--params", '{"kind": "good", "x": 0.25}', "--tell"]

    assert trialq_main(args) == 0

    storage = f"sqlite:///{branches.parent / 'branches.db'}"
    (trial,) = optuna.load_study(study_name="branches", storage=storage).trials
    assert trial.state.name == "COMPLETE" and trial.value == 0.5
    assert trial.params == {"kind": "good", "x": 0.25}
    assert trial.distributions["x"] == optuna.distributions.FloatDistribution(0, 1)


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ('{"kind": "good"}', "missing x (study.search_space asks for it)"),
        ('{"kind": "good", "x": 3}', "x = 3 is outside space.x"),
        ('{"kind": "good", "x": 0.5, "depth": 2}', "unknown depth"),
    ],
)
def test_bad_params_of_a_define_by_run_space_are_one_line_and_exit_2(
    branches: Path, params: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = trialq_main(["run-trial", str(branches), "--params", params])

    err = capsys.readouterr().err
    assert code == 2 and said in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_search_space_that_raises_on_the_params_is_one_line_and_exit_2(
    branches: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (branches.parent / "space.py").write_text("def space(trial):\n    raise KeyError('oops')\n")

    code = trialq_main(["run-trial", str(branches), "--params", '{"kind": "good", "x": 0.5}'])

    err = capsys.readouterr().err
    assert code == 2 and "study.search_space failed on --params: KeyError: 'oops'" in err, err
    assert len(err.strip().splitlines()) == 1, err


OBJECTIVE = """
def objective(trial):
    x = trial.suggest_float("x", -10, 10)
    kind = trial.suggest_categorical("kind", ["a", "b"])
    print("number", trial.number)
    return (x - 2) ** 2 + (kind == "b")
"""

OBJECTIVE_SPEC = """
[study]
name = "objective"
n_trials = 4
[trial]
entrypoint = "objective.py:objective"
"""


@pytest.fixture
def objective_spec(tmp_path: Path) -> Path:
    (tmp_path / "objective.py").write_text(OBJECTIVE)
    path = tmp_path / "objective.toml"
    path.write_text(textwrap.dedent(OBJECTIVE_SPEC))
    return path


def test_an_optuna_objective_runs_here_its_given_params_used_the_rest_drawn(
    objective_spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The objective that runs on the workers runs here unchanged: a name in --params is
    that value, any other is drawn here and said; --tell records what it drew, and
    `trial.number` is the number the study gives it."""
    args = ["run-trial", str(objective_spec), "--params", '{"x": 3.0}', "--tell"]

    assert trialq_main(args) == 0
    out, err = capsys.readouterr()
    assert "number 0" in out
    assert "suggest kind: " in err and "(drawn here: not in --params)" in err
    assert trialq_main(args) == 0
    assert "number 1" in capsys.readouterr().out, "the next run is the study's next trial"

    storage = f"sqlite:///{objective_spec.parent / 'objective.db'}"
    trials = optuna.load_study(study_name="objective", storage=storage).trials
    assert [t.params["x"] for t in trials] == [3.0, 3.0]
    for trial in trials:
        assert trial.value == 1.0 + (trial.params["kind"] == "b")
        assert set(trial.distributions) == {"x", "kind"}
