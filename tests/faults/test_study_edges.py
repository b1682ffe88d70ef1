"""The study's storage at its edges (issue 26, item 13): the study deleted under a running
driver, two drivers racing to create a new SQLite study, and a driver refused on a SQLite
file moved away under the first. Each ends in one line and exit 2, with nothing created."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from waiting import wait_until

from faults.harness import DriverRun, fault_spec, grid
from trialq.local import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def test_the_study_deleted_while_it_runs_ends_the_driver_with_one_line(
    storage_url: str, tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    run = DriverRun(tmp_path, redis_url, study_name="faults", storage_url=storage_url)
    with contextlib.suppress(KeyError):  # left by an earlier run that was itself killed
        optuna.delete_study(study_name="faults", storage=run.storage)
    start_workers(1)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 2.0, 2.5, 3.0), 3))
    driver = run.start()
    wait_until(lambda: _has_trials(run), 60, "the driver to ask its first trial")
    optuna.delete_study(study_name="faults", storage=run.storage)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 2, err
    lines = err.strip().splitlines()  # the line every run starts with ... the one error line
    assert lines[0].startswith("study 'faults' in "), err
    assert lines[-1].startswith("error: study 'faults' deleted while it ran"), err
    assert "Traceback" not in err and sum(line.startswith("error:") for line in lines) == 1, err


def test_two_drivers_racing_on_a_new_sqlite_study_leave_one_refused(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    """Started at once, or 50 ms apart: a race on Optuna's schema that the loser lost about
    one time in two (`UNIQUE constraint failed: alembic_version`, exit 3), so four rounds."""
    start_workers(1)
    for round_, apart_s in enumerate([0.0, 0.05, 0.0, 0.05]):
        run = DriverRun(tmp_path / f"round-{round_}", redis_url)
        run.folder.mkdir()
        run.write_spec(fault_spec("sleeps", grid("sleep_s", 8.0), 1))  # outlasts a slow start
        first = run.start()
        time.sleep(apart_s)
        second = run.start()
        results = [(p.communicate(timeout=120)[1], p.returncode) for p in (first, second)]
        refused = next((err for err, code in results if code == 2), "")
        assert sorted(code for _, code in results) == [0, 2], (round_, results)
        assert refused.strip().startswith("error: study 'faults' has a driver already"), results
        assert len(refused.strip().splitlines()) == 1, refused


def test_a_sqlite_file_moved_under_its_driver_ends_it_in_one_line(
    run: DriverRun, start_workers: Callable[..., LocalCluster]
) -> None:
    """SQLite refuses every write to a file moved since it was opened (a readonly database,
    as a deleted one): the driver ends at its next write, in one line naming the path, and
    releases its lock; it neither waits on an outage nor writes to the moved file."""
    start_workers(1)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 30.0), 1))
    first = run.start()
    wait_until(lambda: _has_trials(run), 60, "the first driver to ask its trial")
    database = run.folder / "faults.db"
    moved = run.folder / "moved"
    moved.mkdir()
    shutil.move(database, moved / "faults.db")
    started = time.monotonic()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 2, err
    assert time.monotonic() - started < 60, "the driver waited for the file to come back"
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"error: the study's database {database} was deleted or moved")
    assert "Traceback" not in err and "unreachable" not in err, err
    assert not database.exists(), "the driver made a new database where the file was"


def _has_trials(run: DriverRun) -> bool:
    try:
        return bool(run.study().trials)
    except KeyError:
        return False


def test_the_sqlite_file_deleted_while_it_runs_ends_the_driver_with_one_line(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    """Taken for an outage before: 300 s of waiting on a file that will never come back, and
    a line saying the storage was unreachable."""
    run = DriverRun(tmp_path, redis_url)
    start_workers(1)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 2.0, 2.5, 3.0), 3))
    driver = run.start("--outage-limit", "100")
    wait_until(lambda: _has_trials(run), 60, "the driver to ask its first trial")
    database = Path(run.storage.removeprefix("sqlite:///"))
    database.unlink()
    started = time.monotonic()
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 2, err
    assert time.monotonic() - started < 30, "the driver waited for the file to come back"
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"error: the study's database {database} was deleted"), err
    assert "Traceback" not in err and "unreachable" not in err, err
