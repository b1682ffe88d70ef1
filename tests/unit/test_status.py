"""`trialq status` on a study built in SQLite, with heartbeats written to the real Redis."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import redis
from studies import SPACE, finished_study

from trialq.cli import trialq_main
from trialq.wire.heartbeat import Heartbeat, RunningTrial, TrialBeacon, WorkerBeat


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'status.db'}"


def _status(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert trialq_main(["status", *args]) == 0
    return capsys.readouterr().out


def test_the_json_counts_match_the_storage(
    storage: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    study = finished_study(storage)
    shown = json.loads(
        _status(capsys, "built", "--storage", storage, "--broker", redis_url, "--json")
    )

    states = Counter(t.state.name for t in study.trials)
    assert (shown["n_complete"], shown["n_pruned"], shown["n_failed"]) == (
        states["COMPLETE"], states["PRUNED"], states["FAIL"],
    )  # fmt: skip
    assert shown["outcomes"] == {"error": 1, "ok": 4, "oom": 1, "pruned": 2}
    assert shown["best_value"] == study.best_value
    assert len(shown["trials"]) == len(study.trials) and shown["workers"] == []


def test_the_table_shows_every_trial_the_best_the_counts_and_what_failed(
    storage: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    study = finished_study(storage)
    out = _status(capsys, "built", "--storage", storage, "--broker", redis_url)

    lines = out.splitlines()
    for trial in study.trials:
        assert any(
            line.split()[:2] == [str(trial.number), trial.user_attrs["outcome"]] for line in lines
        )
    assert f"best trial: #{study.best_trial.number}" in out
    assert "outcomes: error 1, ok 4, oom 1, pruned 2" in out
    assert "#3 error: error: <b>trial 3</b> failed" in out
    assert "#5 oom: oom: <b>trial 5</b> failed" in out
    assert "peak GPU" in out and "live workers: none" in out


def test_live_workers_show_the_trial_each_runs_and_the_running_row_its_host(
    storage: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    study = finished_study(storage)
    running = study.ask(SPACE)
    client = redis.Redis.from_url(redis_url)
    beat = WorkerBeat("w1@gpu-a", "gpu-a", 10, ("gpu",), "0", 0.0)
    heartbeat = Heartbeat(client, beat, interval_s=5, ttl_s=20)
    heartbeat.start()
    claim = RunningTrial("w1@gpu-a", "built", running.number, 2, "task-9", 11, time.time() - 3)
    beacon = TrialBeacon(client, claim, interval_s=5, ttl_s=20).start()
    try:
        shown = json.loads(
            _status(capsys, "built", "--storage", storage, "--broker", redis_url, "--json")
        )
        table = _status(capsys, "built", "--storage", storage, "--broker", redis_url)
    finally:
        beacon.stop()
        heartbeat.stop()
    (worker,) = shown["workers"]
    assert worker["name"] == "w1@gpu-a" and worker["running"][0]["number"] == running.number
    # Started 3 s before the first call; a slow machine may be a few seconds past that.
    assert re.search(r"built #8 \(try 2, [3-9] s, pid 11\)", table), table
    row = next(line for line in table.splitlines() if line.split()[:2] == ["8", "running"])
    assert "w1@gpu-a" in row


def test_an_unreachable_broker_leaves_the_workers_out_not_the_trials(
    storage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    finished_study(storage)
    out = _status(capsys, "built", "--storage", storage, "--broker", "redis://127.0.0.1:1/0")
    assert "live workers: unknown (the broker did not answer: asked redis://127.0.0.1:1/0)" in out
    assert "outcomes: error 1, ok 4, oom 1, pruned 2" in out


def test_an_unknown_study_is_one_line_and_exit_2(
    storage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    optuna.create_study(study_name="other", storage=storage)
    assert trialq_main(["status", "nope", "--storage", storage]) == 2
    err = capsys.readouterr().err
    assert err == f"error: trialq status: no study named 'nope' in {storage}\n"


def test_each_trial_shows_its_params(storage: str, capsys: pytest.CaptureFixture[str]) -> None:
    study = optuna.create_study(study_name="params", storage=storage)
    for params in ({"lr": 0.0031622, "act": "relu"}, {"lr": 0.05, "act": "tanh"}):
        study.enqueue_trial(params)
        trial = study.ask()
        trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        trial.suggest_categorical("act", ["relu", "tanh"])
        study.tell(trial, 1.0)
    out = _status(capsys, "params", "--storage", storage, "--broker", "redis://127.0.0.1:1/0")
    assert "lr=0.00316 act=relu" in out and "lr=0.05 act=tanh" in out, out


def test_a_missing_database_is_named_and_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo.db"
    assert trialq_main(["status", "s", "--storage", f"sqlite:///{missing}"]) == 2
    assert capsys.readouterr().err == (
        f"error: trialq status: no database at {missing} (looked for study 's')\n"
    )
    assert not missing.exists()


def test_a_database_a_driver_is_still_creating_is_read_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`trialq status` polled as a driver starts: the file is there, its schema not yet. The
    reader says there is no such study and writes nothing (Optuna's storage would create the
    schema, racing the driver's own creation, and the driver failed)."""
    starting = tmp_path / "starting.db"
    starting.touch()  # as SQLite leaves it the instant the driver opens it

    assert trialq_main(["status", "s", "--storage", f"sqlite:///{starting}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: trialq status: no study named 's' in sqlite:///{starting}\n"
    assert starting.stat().st_size == 0, "the reader wrote a schema"


def test_a_spec_file_finds_its_study_where_submit_study_put_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "study.toml"
    spec.write_text(
        '[study]\nname = "by-spec"\nn_trials = 1\n[trial]\nentrypoint = "trials:quadratic"\n'
        '[space.x]\ntype = "float"\nlow = 0\nhigh = 1\n'
    )
    study = optuna.create_study(
        study_name="by-spec", storage=f"sqlite:///{tmp_path / 'by-spec.db'}"
    )
    study.enqueue_trial({})
    for command in (
        ["status", str(spec), "--json"],
        ["report", str(spec), "--out", str(tmp_path / "r")],
    ):
        assert trialq_main(command) == 0, capsys.readouterr().err
    assert '"study": "by-spec"' in capsys.readouterr().out


def test_a_failed_trials_own_log_is_named_under_its_failure(
    storage: str, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    study = optuna.create_study(study_name="logged", storage=storage)
    log_file = "/var/log/trialq/logged/trial-0-attempt-2.log"
    attrs = {"outcome": "error", "error": "ValueError: bad", "log_file": log_file}
    study.add_trial(
        optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs=attrs)
    )

    out = _status(capsys, "logged", "--storage", storage, "--broker", redis_url)

    assert f"#0 error: ValueError: bad\n    log: {log_file}" in out
    assert "trials' logs: /var/log/trialq/logged" in out
