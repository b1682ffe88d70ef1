"""The periodic checks' pacing (src/trialq/driver/pacing.py): every interval, or less often
where a check is slow (a driver far from its services)."""

from __future__ import annotations

from trialq.driver.pacing import MOST_OF_THE_TIME, Periodic


def test_a_quick_check_is_due_once_an_interval() -> None:
    check = Periodic(interval_s=2.0)

    assert check.due(0.0)
    check.took(0.0, 0.001)
    assert not check.due(1.9)
    assert check.due(2.0)


def test_a_slow_check_is_spaced_so_it_takes_a_tenth_of_the_time_at_most() -> None:
    check = Periodic(interval_s=2.0)
    assert check.due(0.0)

    check.took(0.0, 1.5)  # 1.5 s of round trips, 400 ms each, on a lossy link

    assert not check.due(2.0)
    assert not check.due(1.5 / MOST_OF_THE_TIME - 0.1)
    assert check.due(1.5 / MOST_OF_THE_TIME)


def test_a_check_that_failed_before_it_ended_waits_its_interval() -> None:
    check = Periodic(interval_s=5.0)

    assert check.due(10.0)  # and it raised: `took` never came
    assert not check.due(14.0)
    assert check.due(15.0)
