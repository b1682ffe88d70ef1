"""The progress display where stderr is no terminal: plain lines, one per change, never a
bar cut at 80 columns (issue 28, item 7)."""

from __future__ import annotations

import pytest

from trialq.driver.progress import Counts, RichProgress


def test_without_a_terminal_each_change_is_one_plain_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with RichProgress("a-study-with-a-rather-long-name-that-a-bar-would-cut", 40) as progress:
        progress.update(Counts(complete=1), 0.5, running=4)
        progress.update(Counts(complete=1), 0.5, running=4)  # unchanged: no new line
        progress.update(Counts(complete=2, failed=1), 0.75, running=3)

    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "a-study-with-a-rather-long-name-that-a-bar-would-cut: 1/40 done | running 4 | "
        "pruned 0 | failed 0 | best 0.5",
        "a-study-with-a-rather-long-name-that-a-bar-would-cut: 3/40 done | running 3 | "
        "pruned 0 | failed 1 | best 0.75",
    ]
