"""`submit-study --local`: no services needed, every process it started is gone afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import optuna
import psutil
import pytest
from waiting import WaitedTooLong, wait_until

from trialq.local import WORKER_NICENESS

pytestmark = pytest.mark.integration

TRIAL_FILE = """
import os, time

def train(params, trial):
    time.sleep(params.get("sleep_s", 0))
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    return {"score": -(params["x"] - 1.0) ** 2, "pid": os.getpid(), "niceness": niceness}
"""


RUN_SUBMIT_STUDY = "from trialq.cli import submit_study_main; raise SystemExit(submit_study_main())"
SUBMIT_STUDY = [sys.executable, "-c", RUN_SUBMIT_STUDY]


def _study_dir(tmp_path: Path, n_trials: int, sleep_s: float = 0.0) -> Path:
    (tmp_path / "mytrial.py").write_text(TRIAL_FILE)
    (tmp_path / "study.toml").write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "local"
            metric = "score"
            n_trials = {n_trials}
            [trial]
            entrypoint = "mytrial:train"
            [space.x]
            type = "float"
            low = -3
            high = 3
            [space.sleep_s]
            type = "categorical"
            choices = [{sleep_s}]
            """
        )
    )
    return tmp_path


RUN_MARK = f"trialq-test-{uuid.uuid4()}"
"""Inherited by every process this test module starts, so leftovers can be told apart."""


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALQ_")}
    env["TRIALQ_TEST_RUN_MARK"] = RUN_MARK
    # A broker on a port where nothing listens: --local must not need it.
    env["TRIALQ_BROKER_URL"] = "redis://127.0.0.1:1/0"
    return env


def _submit(folder: Path, *extra: str) -> subprocess.Popen[str]:
    command = [*SUBMIT_STUDY, "study.toml", "--local", *extra]
    return subprocess.Popen(
        command, cwd=folder, env=_environment(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _descendants_of_trialq() -> list[str]:
    """Processes this module started (they carry RUN_MARK) that are still alive."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if process.info["status"] != psutil.STATUS_ZOMBIE and (
                process.environ().get("TRIALQ_TEST_RUN_MARK") == RUN_MARK
            ):
                found.append(" ".join(process.info["cmdline"] or []))
    return found


def test_local_runs_a_study_from_a_clean_directory_without_services(tmp_path: Path) -> None:
    folder = _study_dir(tmp_path, n_trials=4)
    process = _submit(folder, "--workers", "2", "--json", "--no-progress")
    out, err = process.communicate(timeout=240)

    assert process.returncode == 0, err
    summary = json.loads(out)
    assert summary["n_complete"] == 4
    # Its own secret: every result signed and verified, nothing said of authentication.
    assert "not authenticated" not in err and "set aside" not in err, err
    assert len({t["user_attrs"]["worker_pid"] for t in summary["trials"]}) == 4
    # The trials yield the CPU to the driver, which feeds them all.
    expected = min(os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICENESS, 19)
    assert {t["user_attrs"]["metrics"]["niceness"] for t in summary["trials"]} == {expected}
    assert (folder / "local.db").exists(), "default storage is SQLite next to the spec"
    (run,) = (folder / "local-logs").iterdir()  # one folder a run, named by its start
    assert (run / "worker0.log").exists(), "worker logs beside the study"
    _wait_for_no_descendants()
    assert not _descendants_of_trialq(), "a local worker outlived submit-study"


@pytest.mark.parametrize("ending", ["two Ctrl-C 0.3 s apart", "SIGTERM", "SIGKILL"])
def test_nothing_local_outlives_the_driver_however_it_ends(tmp_path: Path, ending: str) -> None:
    folder = _study_dir(tmp_path, n_trials=6, sleep_s=3.0)  # outlasts the first trial's end
    process = _submit(folder, "--workers", "2", "--no-progress")
    _wait_for_a_complete_trial(f"sqlite:///{folder / 'local.db'}", process)
    if ending == "SIGTERM":
        process.send_signal(signal.SIGTERM)
    elif ending == "SIGKILL":  # no cleanup runs: the children must notice by themselves
        process.kill()
    else:
        process.send_signal(signal.SIGINT)
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
    process.communicate(timeout=60)
    _wait_for_no_descendants()
    assert not _descendants_of_trialq(), f"left running after {ending}"


def test_ctrl_c_exits_130_marks_nothing_complete_and_the_rerun_finishes(tmp_path: Path) -> None:
    # 3 s trials: on a loaded host the study, 1.5 s trials, once ended before the interrupt.
    folder = _study_dir(tmp_path, n_trials=6, sleep_s=3.0)
    process = _submit(folder, "--workers", "2", "--no-progress")
    storage = f"sqlite:///{folder / 'local.db'}"
    _wait_for_a_complete_trial(storage, process)

    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)

    assert process.returncode == 130, err
    assert "interrupted" in err
    _wait_for_no_descendants()
    assert not _descendants_of_trialq(), "a local worker outlived the interrupt"
    study = optuna.load_study(study_name="local", storage=storage)
    for trial in study.trials:
        if trial.state is optuna.trial.TrialState.COMPLETE:
            assert trial.user_attrs["outcome"] == "ok" and trial.values

    rerun = _submit(folder, "--workers", "2", "--json", "--no-progress")
    out, err = rerun.communicate(timeout=240)
    assert rerun.returncode == 0, err
    summary = json.loads(out)
    states = [t["state"] for t in summary["trials"]]
    assert states.count("COMPLETE") + states.count("FAIL") + states.count("PRUNED") == 6
    assert "RUNNING" not in states
    assert [t["number"] for t in summary["trials"]] == list(range(6))


def _wait_for_no_descendants() -> None:
    """A moment for the trial processes (each the leader of its own process group) that
    were killed with their workers to be reaped; the assertion after says what is left."""
    with contextlib.suppress(WaitedTooLong):
        wait_until(lambda: not _descendants_of_trialq(), 30, "the local processes to go", 0.2)


def _wait_for_a_complete_trial(storage: str, process: subprocess.Popen[str]) -> None:
    """Read-only: Optuna's storage, opened while the driver creates the database, writes
    the schema too, and the two raced (UNIQUE constraint failed: alembic_version)."""
    path = Path(storage.removeprefix("sqlite:///")).resolve()

    def finished() -> bool:
        assert process.poll() is None, process.communicate()[1]
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                done = db.execute(
                    "SELECT count(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED', 'FAIL')"
                )
                return bool(done.fetchone()[0])
        except sqlite3.Error:  # no file or no tables yet: the driver is creating them
            return False

    wait_until(finished, 120, "a trial to finish", 0.2)
