"""Reports the storage cannot hold (issue 38, rows 1 and 8): a step past 32 or 64 bits ended
the driver with exit 4 on every run (PostgreSQL `integer out of range`, SQLite `Python int
too large`), so the study could never move; NaN and infinite values were dropped without a
word. Now each is refused where it enters, counted in `reports_dropped`, and the study goes
on."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import redis

from faults.harness import DriverRun, fault_spec, grid
from trialq.local import LocalCluster
from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.keys import REPORTS

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def test_a_step_past_the_storage_and_nan_reports_are_refused_and_the_study_goes_on(
    storage_url: str, tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    run = DriverRun(tmp_path, redis_url, storage_url=storage_url)
    with contextlib.suppress(KeyError):  # left by an earlier run on this PostgreSQL
        optuna.delete_study(study_name=run.study_name, storage=run.storage)
    start_workers(1)
    run.write_spec(fault_spec("reports_past_the_storage", grid("step", 3_000_000_000, 2**70), 2))

    code, err = run.run()

    assert code == 0, err
    trials = run.study().trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"], err
    for trial in trials:
        assert trial.intermediate_values == {0: 1.0, 3: 3.0}
        assert trial.user_attrs["reports_dropped"] == 3, trial.user_attrs


def test_an_entry_past_the_storage_written_into_redis_is_never_handed_on(
    redis_url: str,
) -> None:
    """Whoever writes the stream (an older worker, anyone who reaches Redis): the driver
    reads only the reports the storage holds."""
    client = redis.Redis.from_url(redis_url)
    address = TrialAddress("forged", 0, 1)
    key = address.key(REPORTS)
    client.delete(key)
    for step, value in [(0, "1.0"), (2**70, "2.0"), (-1, "2.0"), ("x", "2.0"), (1, "nan"),
                        (2, "inf"), (3, "many"), (4, "4.0")]:  # fmt: skip
        client.xadd(key, {"step": step, "value": value})
    reports = ReportChannel(client).read_new({address: "0"})[address]
    assert [(r.step, r.value) for r in reports] == [(0, 1.0), (4, 4.0)]
