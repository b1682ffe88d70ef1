"""When failing trials stop the run: the same failure, in a row, with no success between."""

from __future__ import annotations

from trialq.driver.failure_streak import FailureStreak
from trialq.wire.messages import Outcome

E, OK = Outcome.ERROR, Outcome.OK
SAME = "RuntimeError: no GPU on host 3\n  File ..."


def _feed(streak: FailureStreak, ends: list[tuple[Outcome, str | None]]) -> list[str | None]:
    return [streak.saw(outcome, error) for outcome, error in ends]


def test_the_limit_th_same_failure_in_a_row_names_the_cause() -> None:
    said = _feed(FailureStreak(3), [(E, SAME)] * 3)

    assert said[:2] == [None, None]
    assert said[2] == (
        "stopped: 3 trials in a row error the same way (RuntimeError: no GPU on host 3); "
        "the rest of the budget is kept (max_failures_in_a_row = 3)"
    )


def test_numbers_in_the_error_do_not_make_failures_different() -> None:
    ends = [(E, f"RuntimeError: no GPU on host {n}") for n in range(3)]

    assert _feed(FailureStreak(3), ends)[-1] is not None


def test_a_success_or_a_different_failure_starts_the_count_again() -> None:
    ends = [(E, SAME), (E, SAME), (OK, None), (E, SAME), (E, "ValueError: x"), (E, SAME)]

    assert _feed(FailureStreak(3), ends) == [None] * 6


def test_what_a_search_learns_from_never_counts() -> None:
    for outcome in (Outcome.OOM, Outcome.TIMEOUT, Outcome.NOT_FINITE, Outcome.PRUNED):
        assert _feed(FailureStreak(2), [(outcome, "same")] * 4) == [None] * 4


def test_refusals_are_named_as_the_workers() -> None:
    said = _feed(FailureStreak(2), [(Outcome.REFUSED, "json:dumps not allowed")] * 2)

    assert said[-1] is not None and "refused by their workers" in said[-1]


def test_a_limit_of_zero_never_stops() -> None:
    assert _feed(FailureStreak(0), [(E, SAME)] * 50) == [None] * 50


def test_guard_kills_in_a_row_stop_the_run_naming_the_guard() -> None:
    kill = "killed by trialq's GPU memory guard: NVML counted {} MiB for the trial's processes"
    said = _feed(FailureStreak(2), [(Outcome.GPU_GUARD, kill.format(n)) for n in (9000, 9100)])

    assert said[-1] is not None and "killed by the GPU memory guard the same way" in said[-1]
