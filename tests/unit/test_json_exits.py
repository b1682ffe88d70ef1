"""`--json` answers at every exit: one JSON object on stdout naming the exit code and the
error's line, whatever ended the command (a script piping into `jq` always reads one)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from bad_inputs import spec_text

from trialq.cli import submit_study_main, trialq_main


def _one_object(out: str) -> dict[str, object]:
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    answer = json.loads(lines[0])
    assert isinstance(answer, dict)
    return answer


@pytest.mark.parametrize(
    ("argv", "code", "expected"),
    [
        (["{spec}", "--n-trials", "0"], 2, "--n-trials: expected a positive integer"),
        (["{missing}"], 2, "missing.toml"),
        (["{bad}"], 2, "study.bogus: unknown key"),
        (["{spec}", "--broker", "redis://127.0.0.1:1/0"], 3, "broker unreachable"),
        (["{changed}"], 2, "direction"),
    ],
    ids=["bad argument", "missing file", "bad spec", "unreachable broker", "changed direction"],
)
def test_every_exit_under_json_prints_one_object(
    argv: list[str],
    code: int,
    expected: str,
    write_spec: Callable[..., Path],
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = {
        "{spec}": write_spec(spec_text()),
        "{bad}": write_spec(spec_text(study='name = "s"\nn_trials = 3\nbogus = 1'), name="b.toml"),
        "{changed}": _spec_of_a_study_that_minimizes(write_spec),
    }
    paths["{missing}"] = paths["{spec}"].parent / "missing.toml"
    args = [str(paths.get(arg, arg)) for arg in argv]
    if "--broker" not in args:
        args += ["--broker", redis_url]

    assert submit_study_main([*args, "--json", "--no-progress"]) == code

    out, err = capsys.readouterr()
    answer = _one_object(out)
    assert answer["exit_code"] == code
    assert expected in str(answer["error"]), answer
    assert answer["error"] == err.strip()


def _spec_of_a_study_that_minimizes(write_spec: Callable[..., Path]) -> Path:
    spec = write_spec(spec_text(study='name = "turned"\nn_trials = 3\ndirection = "maximize"'),
                      name="turned.toml")  # fmt: skip
    optuna.create_study(study_name="turned", storage=f"sqlite:///{spec.parent / 'turned.db'}")
    return spec


def test_trialq_status_under_json_answers_its_errors_in_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert trialq_main(["status", "--json"]) == 2
    answer = _one_object(capsys.readouterr().out)
    assert answer["exit_code"] == 2 and "required: study" in str(answer["error"])
