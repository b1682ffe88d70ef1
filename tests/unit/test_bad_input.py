"""Bad specs and bad arguments: one line naming the file, the key and what was expected;
exit code 2; nothing enqueued (the broker's database stays empty)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from bad_inputs import BAD_ARGS, BAD_SPECS, spec_text

from trialq.cli import submit_study_main, trialq_main


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_is_one_line_exit_2_and_nothing_enqueued(
    case: str,
    write_spec: Callable[..., Path],
    redis_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text, expected = BAD_SPECS[case]
    path = write_spec(text)

    code = submit_study_main([str(path), "--broker", redis_url, "--no-progress"])

    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert str(path) in err or (case in {"bad queue name"} and "trial.queue" in err)
    assert expected in err
    assert redis.Redis.from_url(redis_url).dbsize() == 0, "something was enqueued"
    assert not list(path.parent.glob("*.db")), "a study was created"


def test_yaml_spec_with_the_same_keys_is_accepted_and_checked(
    write_spec: Callable[..., Path], redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_spec(
        "study: {name: s, n_trials: 1, bogus: 2}\n"
        "trial: {entrypoint: 'trials:quadratic'}\n"
        "space: {x: {type: float, low: 0, high: 1}}\n",
        name="study.yaml",
    )
    assert submit_study_main([str(path), "--broker", redis_url]) == 2
    assert "study.bogus: unknown key" in capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_arguments_are_one_line_exit_2(
    case: str, write_spec: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(spec_text())
    argv, expected = BAD_ARGS[case]
    code = submit_study_main([arg.replace("{spec}", str(spec)) for arg in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and expected in err, err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "the following arguments are required: command"),
        (["statu", "x"], "invalid choice: 'statu'"),
        (["status"], "the following arguments are required: study"),
    ],
)
def test_bad_trialq_arguments_are_one_line_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = trialq_main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and expected in err, err


def test_unreachable_broker_is_exit_3_with_one_line(
    write_spec: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(spec_text())
    code = submit_study_main([str(spec), "--broker", "redis://127.0.0.1:1/0", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert err.startswith("error: broker unreachable") and len(err.splitlines()) == 1


def test_unreachable_storage_is_exit_3_with_one_line(
    write_spec: Callable[..., Path], redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(spec_text())
    storage = "postgresql+psycopg2://nobody:secret@127.0.0.1:1/none"
    code = submit_study_main([str(spec), "--broker", redis_url, "--storage", storage])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert "unreachable" in err and "secret" not in err and len(err.splitlines()) == 1


def test_a_storage_whose_driver_is_missing_is_named_in_one_line(
    write_spec: Callable[..., Path], redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(spec_text())
    storage = "mysql+mysqldb://nobody:secret@127.0.0.1:1/none"  # mysqlclient is not installed
    code = submit_study_main([str(spec), "--broker", redis_url, "--storage", storage])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert "driver missing: Python module 'MySQLdb' is not installed" in err, err
    assert "secret" not in err and len(err.splitlines()) == 1
