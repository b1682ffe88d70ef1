"""Which reports the storage holds (issue 38, rows 1 and 8), as a table, and what a trial
sees of a refused one: nothing but a count and one log line."""

from __future__ import annotations

import logging

import pytest
from kept_reports import KeptReports

from trialq.trial.context import TrialContext
from trialq.wire.channel import TrialAddress, report_refusal


@pytest.mark.parametrize(
    ("step", "value", "refused"),
    [
        (0, 1.0, None),
        (2**31 - 1, -1e308, None),
        (2**31, 1.0, "outside what the storage holds"),
        (-1, 1.0, "outside what the storage holds"),
        (1.0, 1.0, "not an integer"),
        (True, 1.0, "not an integer"),
        (1, float("nan"), "not finite"),
        (1, float("-inf"), "not finite"),
        (1, "2", "not a number"),
    ],
)
def test_the_rule_for_a_report(step: object, value: object, refused: str | None) -> None:
    refusal = report_refusal(step, value)
    assert refusal is None if refused is None else refused in str(refusal)


def test_a_trial_reporting_what_the_storage_cannot_hold_goes_on_counted_and_told_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = KeptReports()
    context = TrialContext(TrialAddress("s", 0, 1), {}, channel)
    with caplog.at_level(logging.WARNING, logger="trialq.reports"):
        context.report(1.0, 0)
        context.report(2.0, 3_000_000_000)
        context.report(float("nan"), 1)
        context.report(float("inf"), 2)
        context.report(3.0, 3)
    assert channel.reports == [(0, 1.0), (3, 3.0)]
    assert context.reports_refused == 3 and context.last_step == 3
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "step 3000000000 is outside" in refused[0], refused
