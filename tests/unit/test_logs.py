"""Structured logs: every line names the study, trial and attempt, and stays off by default."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from trialq import logs
from trialq.cli import _log_to_stderr
from trialq.settings import Settings
from trialq.wire.channel import TrialAddress


@pytest.fixture(autouse=True)
def _restore_trialq_logger() -> Iterator[None]:
    """`to_stderr` configures a process-wide logger: put it back for the other tests."""
    logger = logging.getLogger("trialq")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers, logger.level, logger.propagate = saved[0], saved[1], saved[2]


def _record(**extra: str) -> logging.LogRecord:
    record = logging.LogRecord("trialq.test", logging.INFO, __file__, 1, "hello", None, None)
    record.__dict__.update(extra)
    logs.ContextFilter().filter(record)
    return record


def test_a_line_inside_a_trial_names_it_and_outside_shows_dashes() -> None:
    with logs.trial_context(TrialAddress("digits", 7, 2)):
        inside = _record()
    outside = _record()
    assert (inside.study, inside.trial, inside.attempt) == ("digits", "7", "2")  # type: ignore[attr-defined]
    assert (outside.study, outside.trial, outside.attempt) == ("-", "-", "-")  # type: ignore[attr-defined]


def test_fields_passed_per_call_win_over_the_context() -> None:
    with logs.trial_context(TrialAddress("a", 1, 1)):
        record = _record(**logs.fields(TrialAddress("b", 2, 3)))
    assert (
        logging.Formatter(logs.FORMAT).format(record).endswith("study=b trial=2 attempt=3 | hello")
    )


def test_submit_study_logs_nothing_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("trialq.driver")
    _log_to_stderr(verbose=False, settings=Settings())
    logger.info("sent", extra=logs.fields(TrialAddress("s", 0, 1)))
    assert capsys.readouterr().err == ""

    _log_to_stderr(verbose=True, settings=Settings())
    _log_to_stderr(verbose=True, settings=Settings())  # twice: still one handler
    logger.info("sent", extra=logs.fields(TrialAddress("s", 0, 1)))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "INFO trialq.driver" in lines[0]
    assert lines[0].endswith("study=s trial=0 attempt=1 | sent")


def test_trialq_log_level_overrides_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    _log_to_stderr(verbose=True, settings=Settings(log_level="warning"))  # type: ignore[arg-type]
    logging.getLogger("trialq.driver").info("quiet")
    logging.getLogger("trialq.driver").warning("loud")
    assert capsys.readouterr().err.count("|") == 1
