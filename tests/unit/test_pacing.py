"""The periodic checks' pacing (src/trialq/driver/pacing.py): every interval, or less often
where a check is slow (a driver far from its services); and which trials a pass reads."""

from __future__ import annotations

import pytest

from trialq.driver.pacing import MOST_OF_THE_TIME, MOST_PAUSE_S, PassPacing, Periodic


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


IN_FLIGHT = [f"task-{i}" for i in range(1000)]
POLL_S = 0.05


def test_a_pass_between_full_ones_reads_only_the_trials_announced() -> None:
    """At a thousand in flight, a result costs a read of its own trial: the pass it brings
    reads the announced ids still in flight, and each is read once."""
    pacing = PassPacing()
    assert pacing.to_read(0.0, set(), IN_FLIGHT) == IN_FLIGHT and pacing.full
    pacing.reading(0.0, 0.002)
    pacing.read(0.02, POLL_S)  # 2 ms of reads, announcements heard: the next full pass 200 ms on

    read = pacing.to_read(0.1, {"task-3", "task-7", "gone"}, IN_FLIGHT)

    assert not pacing.full and sorted(read) == ["task-3", "task-7"]
    pacing.read(0.1, POLL_S)
    assert pacing.to_read(0.15, set(), IN_FLIGHT) == []
    assert pacing.pause_s(0.15) == pytest.approx(0.07)


def test_the_next_full_pass_is_ten_times_its_reads_on_at_most_a_second() -> None:
    pacing = PassPacing()
    pacing.to_read(0.0, None, IN_FLIGHT)
    pacing.reading(0.0, 0.5)
    pacing.read(0.5, POLL_S)

    assert pacing.pause_s(0.5) == MOST_PAUSE_S
    pacing.to_read(1.49, set(), IN_FLIGHT)
    assert not pacing.full
    assert pacing.to_read(1.5, set(), IN_FLIGHT) == IN_FLIGHT and pacing.full


@pytest.mark.parametrize(("announced", "pause_s"), [(set(), 0.8), (None, 0.08)])
def test_full_reads_take_a_hundredth_of_the_time_while_heard_else_a_tenth(
    announced: set[str] | None, pause_s: float
) -> None:
    """While each result brings its own pass, a full pass is only the net for what is not
    announced: 128 trials' reads need not come with about every result (issue 42)."""
    pacing = PassPacing()
    pacing.to_read(0.0, announced, IN_FLIGHT)
    pacing.reading(0.0, 0.008)
    pacing.read(0.008, POLL_S)

    assert pacing.pause_s(0.008) == pytest.approx(pause_s)


def test_announcements_that_may_have_gone_unheard_make_the_pass_a_full_one() -> None:
    pacing = PassPacing()
    pacing.to_read(0.0, set(), IN_FLIGHT)
    pacing.read(0.0, POLL_S)

    assert pacing.to_read(0.01, None, IN_FLIGHT) == IN_FLIGHT and pacing.full


def test_an_announced_trial_a_failed_pass_did_not_read_is_read_by_the_next() -> None:
    """A pass that met an outage never says its reads were done: what was announced to it
    is still owed (the announcement is not heard twice)."""
    pacing = PassPacing()
    pacing.to_read(0.0, set(), IN_FLIGHT)
    pacing.read(0.0, POLL_S)
    assert pacing.to_read(0.01, {"task-1"}, IN_FLIGHT) == ["task-1"]  # and the pass raised

    assert pacing.to_read(0.02, set(), IN_FLIGHT) == ["task-1"]
