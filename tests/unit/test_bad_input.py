"""Bad specs and bad arguments: one line naming the file, the key and what was expected;
exit code 2; nothing enqueued (the broker's database stays empty)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from trialq.cli import submit_study_main

GOOD = {
    "study": 'name = "s"\nn_trials = 3\nmetric = "score"',
    "trial": 'entrypoint = "trials:quadratic"',
    "space": '[space.x]\ntype = "float"\nlow = 0\nhigh = 1',
}


def _spec(**tables: str) -> str:
    parts = {**GOOD, **tables}
    return f"[study]\n{parts['study']}\n[trial]\n{parts['trial']}\n{parts['space']}\n"


BAD_SPECS = {
    "unknown key": (_spec(study=GOOD["study"] + "\nbogus = 1"), "study.bogus: unknown key"),
    "wrong type": (_spec(study='name = "s"\nn_trials = "many"'), "study.n_trials"),
    "missing n_trials": (_spec(study='name = "s"'), "study.n_trials: missing required key"),
    "low > high": (
        _spec(space='[space.x]\ntype = "float"\nlow = 2\nhigh = 1'),
        "space.x: low (2.0) must not be greater than high (1.0)",
    ),
    "empty choices": (
        _spec(space='[space.x]\ntype = "categorical"\nchoices = []'),
        "space.x.choices",
    ),
    "unknown param type": (
        _spec(space='[space.x]\ntype = "complex"\nlow = 0'),
        "space.x: type must be one of float, int, categorical",
    ),
    "log with low <= 0": (
        _spec(space='[space.x]\ntype = "float"\nlow = 0\nhigh = 1\nlog = true'),
        "space.x: log = true needs low > 0",
    ),
    "entrypoint module missing": (
        _spec(trial='entrypoint = "no_such_module_xyz:train"'),
        "trial.entrypoint: no module named 'no_such_module_xyz'",
    ),
    "entrypoint function missing": (
        _spec(trial='entrypoint = "trials:no_such_function"'),
        "trial.entrypoint: trials has no function 'no_such_function'",
    ),
    "entrypoint not callable": (
        _spec(trial='entrypoint = "trials:NOT_CALLABLE"'),
        "trial.entrypoint: trials:NOT_CALLABLE is not callable",
    ),
    "entrypoint malformed": (
        _spec(trial='entrypoint = "trials.quadratic"'),
        "trial.entrypoint: expected 'module:function'",
    ),
    "entrypoint file missing": (
        _spec(trial='entrypoint = "missing.py:train"'),
        "trial.entrypoint: file",
    ),
    "no search space": (_spec(space=""), "no search space"),
    "unknown sampler": (_spec(study=GOOD["study"] + '\nsampler = "magic"'), "study.sampler"),
    "bad sampler args": (
        _spec(study=GOOD["study"] + "\nsampler_args = { nonsense = 1 }"),
        "study.sampler_args:",
    ),
    "bad pruner args": (
        _spec(study=GOOD["study"] + "\npruner_args = { nonsense = 1 }"),
        "study.pruner_args:",
    ),
    "both direction and directions": (
        _spec(study=GOOD["study"] + '\ndirection = "minimize"\ndirections = ["minimize"]'),
        "give direction or directions, not both",
    ),
    "multi-objective without metrics": (
        _spec(study='name = "s"\nn_trials = 3\ndirections = ["minimize", "maximize"]'),
        "needs metrics",
    ),
    "negative timeout": (_spec(trial=GOOD["trial"] + "\ntimeout_s = -1"), "trial.timeout_s"),
    "timeout beyond the visibility timeout": (
        _spec(trial=GOOD["trial"] + "\ntimeout_s = 100000"),
        "trial.timeout_s: 100000 s plus grace needs TRIALQ_VISIBILITY_TIMEOUT_S",
    ),
    "bad queue name": (_spec(trial=GOOD["trial"] + '\nqueue = "a b"'), "trial.queue"),
    "not TOML": ("[study\nname=", "not valid TOML"),
    "grid over floats": (_spec(study=GOOD["study"] + '\nsampler = "grid"'), "space.x: the grid"),
}


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


BAD_ARGS = {
    "missing spec file": (["nonexistent.toml"], "cannot read the spec"),
    "workers without local": (["{spec}", "--workers", "2"], "--workers needs --local"),
    "zero workers": (["{spec}", "--local", "--workers", "0"], "expected a positive integer"),
    "negative n-trials": (["{spec}", "--n-trials", "-3"], "expected a positive integer"),
    "local and broker": (["{spec}", "--local", "--broker", "redis://x"], "exclude each other"),
    "unknown flag": (["{spec}", "--frobnicate"], "unrecognized arguments: --frobnicate"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGS))
def test_bad_arguments_are_one_line_exit_2(
    case: str, write_spec: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(_spec())
    argv, expected = BAD_ARGS[case]
    code = submit_study_main([arg.replace("{spec}", str(spec)) for arg in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and expected in err, err


def test_unreachable_broker_is_exit_3_with_one_line(
    write_spec: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(_spec())
    code = submit_study_main([str(spec), "--broker", "redis://127.0.0.1:1/0", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert err.startswith("error: broker unreachable") and len(err.splitlines()) == 1


def test_unreachable_storage_is_exit_3_with_one_line(
    write_spec: Callable[..., Path], redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = write_spec(_spec())
    storage = "postgresql+psycopg2://nobody:secret@127.0.0.1:1/none"
    code = submit_study_main([str(spec), "--broker", redis_url, "--storage", storage])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert "unreachable" in err and "secret" not in err and len(err.splitlines()) == 1
