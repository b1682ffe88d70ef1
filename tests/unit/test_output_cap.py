"""A trial's stdout and stderr share one cap; past it the rest is dropped, said once."""

from __future__ import annotations

import io
import sys

import pytest

from trialq.trial.output_cap import capped_output


def test_stdout_and_stderr_share_the_cap_and_the_drop_is_said_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with capped_output(25) as budget:
        print("a" * 9)  # 10 bytes
        print("b" * 9, file=sys.stderr)  # 20
        for _ in range(100):
            print("c" * 9)
    assert sys.stdout is out and sys.stderr is err
    assert out.getvalue().startswith("a" * 9 + "\n" + "c" * 5)
    assert "b" * 9 in err.getvalue()
    said = out.getvalue() + err.getvalue()
    assert said.count("trial output capped at 25 bytes") == 1
    assert budget is not None and budget.dropped == 1020 - 25


def test_zero_is_no_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with capped_output(0):
        print("x" * 10_000)
    assert len(out.getvalue()) == 10_001 and sys.stdout is out
