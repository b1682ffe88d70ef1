"""Two studies of one name, each in its own storage, run at once on one broker: each trial's
intermediate values are its own study's. Their report keys are named by the study's key
(its storage and id, hashed), not by the name the two share."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from faults.harness import DriverRun, assert_clean, fault_spec, grid
from trialq.local import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def test_two_studies_of_one_name_in_two_storages_keep_their_own_reports(
    tmp_path_factory: pytest.TempPathFactory,
    redis_url: str,
    start_workers: Callable[..., LocalCluster],
) -> None:
    start_workers(2)
    runs = {x: DriverRun(tmp_path_factory.mktemp(f"twin-{x}"), redis_url) for x in (0.9, 0.7)}
    for x, run in runs.items():
        run.write_spec(fault_spec("reports_curve", grid("x", x), 1, in_flight=1))
    drivers = {x: run.start() for x, run in runs.items()}
    for driver in drivers.values():
        _, err = driver.communicate(timeout=120)
        assert driver.returncode == 0, err

    first, second = (run.study().trials[0] for run in runs.values())
    assert first.datetime_start < second.datetime_complete, "the twins did not overlap"
    assert second.datetime_start < first.datetime_complete, "the twins did not overlap"
    for x, run in runs.items():
        assert_clean(run.judge(f"a twin study (one name, another storage) at once, x={x}", 1))
        (trial,) = run.study().trials
        expected = {step: pytest.approx(x * (step + 1)) for step in range(10)}
        assert trial.intermediate_values == expected, "a twin study's reports were relayed"
